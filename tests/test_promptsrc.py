"""PromptSRC: self-consistency losses, frozen targets, Gaussian prompt aggregation
(what is saved and evaluated, exact resume), and the reduction to IVLP."""
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, learnable, make_cfg, tiny_node, tiny_runner, toy_world  # noqa: F401

from trainers.promptsrc import TEXT_TARGET_COUNT, PromptSRCCLIP, gpa_weights
from vlprompt.clip import imagenet_templates
from vlprompt.methods.prompt_aggregation import GaussianPromptAggregation

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TOL = dict(rtol=1e-5, atol=1e-5)


def test_text_target_averages_unnormalised_features_of_60_templates(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    templates = imagenet_templates()[:TEXT_TARGET_COUNT]
    assert len(imagenet_templates()) == 80 and len(templates) == 60 and "a photo of a {}." in templates
    assert "a toy {}." not in templates  # one of the 20 left out
    model = PromptSRCCLIP(runner, tokenizer, CLASSNAMES, tiny_node("PromptSRC"))
    sentences = [t.format(c.replace("_", " ")) for t in templates for c in CLASSNAMES]
    with torch.no_grad():
        raw = runner.encode_text(tokenizer(sentences)).view(60, len(CLASSNAMES), -1)
    torch.testing.assert_close(model.frozen_text_features(), F.normalize(raw.mean(0), dim=-1), **TOL)
    assert not torch.allclose(model.frozen_text_features(), F.normalize(F.normalize(raw, dim=-1).mean(0), dim=-1), atol=1e-6)


def test_loss_is_the_weighted_sum_of_the_four_terms(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    model = PromptSRCCLIP(runner, tokenizer, CLASSNAMES, tiny_node("PromptSRC", TEXT_LOSS_WEIGHT=25, IMAGE_LOSS_WEIGHT=10))
    with torch.no_grad():
        model.prompt_learner.ctx.add_(torch.randn_like(model.prompt_learner.ctx))
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 1])
    loss, logits, _ = model.loss(images, labels)
    with torch.no_grad():
        text, image = model.class_text_features(), model.image_features(images)
        frozen_text = model.frozen_text_features()
        frozen_image = F.normalize(runner.encode_image(images), dim=-1)
        teacher = model.logit_scale * frozen_image @ frozen_text.t()
        p_teacher = teacher.softmax(1)
        kl = (p_teacher * (p_teacher.log() - logits.log_softmax(1))).sum() / (4 * 3)
        expected = (F.cross_entropy(logits, labels) + 25 * (text - frozen_text).abs().mean()
                    + 10 * (image - frozen_image).abs().mean() + kl)
    torch.testing.assert_close(loss.detach(), expected, **TOL)
    assert kl > 1e-4


def test_without_regularisers_and_gpa_promptsrc_trains_exactly_like_ivlp(toy_world, tmp_path):  # noqa: F811
    sizes = {"N_CTX_TEXT": 4, "N_CTX_VISION": 4, "PROMPT_DEPTH_TEXT": 2, "PROMPT_DEPTH_VISION": 3}
    off = {"TEXT_LOSS_WEIGHT": 0, "IMAGE_LOSS_WEIGHT": 0, "LOGITS_LOSS_WEIGHT": 0, "GPA": False}
    trajectories = []
    for name, node in (("IVLP", sizes), ("PromptSRC", {**sizes, **off})):
        trainer = build_seeded(make_cfg(toy_world, name, tmp_path / name, node=node, OPTIM__MAX_EPOCH=2,
                                        TRAIN__CHECKPOINT_FREQ=1, TEST__NO_TEST=True))
        steps = []
        step = trainer.forward_backward
        trainer.forward_backward = lambda batch: (step(batch), steps.append(learnable(trainer.model)))[0]
        trainer.train()
        trajectories.append(steps)
    assert len(trajectories[0]) == 6
    for ivlp, promptsrc in zip(*trajectories):
        assert ivlp.keys() == promptsrc.keys()
        assert all(torch.equal(ivlp[key], promptsrc[key]) for key in ivlp)


@pytest.mark.parametrize("epochs, mean, std, expected", [
    (20, 15, 1, {12: 0.0044, 13: 0.0540, 14: 0.2420, 15: 0.3989, 16: 0.2420, 17: 0.0540, 18: 0.0044}),
    (20, 6, 10, {1: 0.0554, 6: 0.0628, 20: 0.0236}),
    (50, 30, 30, {1: 0.0141, 30: 0.0225, 50: 0.0180}),
    (50, 45, 5, {45: 0.0923}),
])
def test_gpa_weights_match_the_spec(epochs, mean, std, expected):
    weights = gpa_weights(epochs, mean, std)
    assert weights.shape == (epochs,) and abs(weights.sum() - 1) < 1e-12
    for epoch, value in expected.items():
        assert round(weights[epoch - 1], 4) == value
    assert gpa_weights(3, 500, 1) is None


def test_aggregating_unchanged_prompts_gives_them_back():
    prompts = {"a": torch.randn(4, 8), "b": torch.randn(2, 3)}
    gpa = GaussianPromptAggregation(gpa_weights(20, 15, 1))
    for epoch in range(20):
        gpa.add(epoch, prompts)
    for key, value in prompts.items():
        torch.testing.assert_close(gpa.total[key], value, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def gpa_run(toy_world, tmp_path_factory):  # noqa: F811
    """A 3-epoch PromptSRC run (GPA mean 2, std 1) saving every epoch; records the raw
    learnable tensors each epoch. Returns (output dir, raw per epoch, trainer, stdout)."""
    output = tmp_path_factory.mktemp("gpa_run")
    cfg = make_cfg(toy_world, "PromptSRC", output, node={"GPA_MEAN": 2, "GPA_STD": 1},
                   TRAIN__CHECKPOINT_FREQ=1, TEST__NO_TEST=True)
    trainer = build_seeded(cfg)
    raw = []
    add = trainer.gpa.add
    trainer.gpa.add = lambda epoch, tensors: (raw.append({k: v.detach().clone() for k, v in tensors.items()}), add(epoch, tensors))
    trainer.train()
    return output, raw, trainer


def saved(folder, epoch):
    return torch.load(folder / "VLPromptLearner" / f"model.pth.tar-{epoch}", weights_only=True)


def test_gpa_aggregate_is_saved_as_the_final_model_and_evaluated(gpa_run, capsys):
    output, raw, trainer = gpa_run
    weights = gpa_weights(3, 2, 1)
    assert np.allclose(weights, [0.2741, 0.4519, 0.2741], atol=1e-4)
    final = learnable(trainer.model)
    for key in final:
        expected = sum(float(w) * epoch[key] for w, epoch in zip(weights, raw))
        torch.testing.assert_close(final[key], expected, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(final[key], raw[-1][key])
    last = saved(output, 3)
    assert set(last["state_dict"]) == set(final)
    assert all(torch.equal(last["state_dict"][key], final[key]) for key in final)
    for epoch in (1, 2):  # intermediate checkpoints hold the raw prompts and the running sum
        checkpoint = saved(output, epoch)
        assert all(torch.equal(checkpoint["state_dict"][key], raw[epoch - 1][key]) for key in final)
        assert checkpoint["trainer_state"]["gpa"]["epochs"] == list(range(epoch))
    # What is evaluated is what is saved: a fresh eval-only trainer reproduces the logits.
    images = next(iter(trainer.test_loader))["img"]
    evaluator = build_seeded(trainer.cfg)
    evaluator.load_model(str(output), epoch=3)
    for t in (trainer, evaluator):
        t.set_model_mode("eval")
    with torch.no_grad():
        assert torch.equal(trainer.model_inference(images), evaluator.model_inference(images))


def test_gpa_run_logs_the_final_switch(toy_world, tmp_path, capsys):  # noqa: F811
    cfg = make_cfg(toy_world, "PromptSRC", tmp_path, OPTIM__MAX_EPOCH=1, TEST__NO_TEST=True, node={"GPA_MEAN": 1})
    build_seeded(cfg).train()
    lines = capsys.readouterr().out.splitlines()
    assert lines.index("Using GPA model for final inference...") < next(
        i for i, line in enumerate(lines) if line.startswith("Checkpoint saved to"))


def test_resumed_run_gives_the_same_aggregate(gpa_run, tmp_path):
    output, _, trainer = gpa_run
    folder = tmp_path / "VLPromptLearner"
    folder.mkdir()
    shutil.copy(output / "VLPromptLearner" / "model.pth.tar-1", folder)
    (folder / "checkpoint").write_text("model.pth.tar-1\n")
    resumed = build_seeded(trainer.cfg.clone())
    resumed.cfg.defrost()
    resumed.cfg.OUTPUT_DIR = resumed.output_dir = str(tmp_path)
    resumed.train()
    uninterrupted, again = saved(output, 3)["state_dict"], saved(tmp_path, 3)["state_dict"]
    assert all(torch.equal(uninterrupted[key], again[key]) for key in uninterrupted)
