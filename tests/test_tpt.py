"""TPT: one episode against a hand computation (CoOp context), CoCoOp's per-image context, MaPLe's
selection pass, resets, and the source model loaded with --model-dir (CoOp+TPT)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.config import ConfigError
from vlprompt.engine import build_trainer
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree

VIEWS = ("TRAINER.TPT.NUM_VIEWS", "8", "TRAINER.TPT.SELECTION", "0.25", "DATALOADER.TEST.BATCH_SIZE", "2")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tpt_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:3], train=2, val=1, test=2)
    return root


def make_tpt(data_root, clip_files, output_dir, config="synthetic.yaml", *opts):
    cfg = toy_pets_cfg("TPT", f"TPT/{config}", data_root, str(output_dir), clip_files, *VIEWS, *opts)
    return build_trainer(cfg)


def first_views(trainer):
    return next(iter(trainer.test_loader))["img"][0]


def entropy_of_mean(logits):
    probs = logits.softmax(dim=-1).mean(dim=0)
    return -(probs * probs.log()).sum()


def adamw_first_step(value, grad, lr, weight_decay, eps=1e-8):
    """AdamW's first step by hand: bias-corrected moments g and g², decoupled decay."""
    return value * (1 - lr * weight_decay) - lr * grad / (grad.abs() + eps)


def test_coop_episode_is_one_adamw_step_on_the_kept_views(data_root, tiny_clip_files, tmp_path):
    tpt = make_tpt(data_root, tiny_clip_files, tmp_path)
    tpt.start_episodes()
    views = first_views(tpt)
    model = tpt.model
    start = model.prompt_learner.ctx.detach().clone()
    # by hand
    features = F.normalize(model.clip.encode_image(views), dim=-1)
    ctx = model.prompt_learner.ctx
    ctx.requires_grad_(True)
    logits = model.logit_scale * features @ F.normalize(model.compute_text_features(), dim=-1).t()
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    kept = entropy.argsort()[:2]
    loss = entropy_of_mean(logits[kept])
    (grad,) = torch.autograd.grad(loss, ctx)
    ctx.requires_grad_(False)
    tuned = adamw_first_step(start, grad, lr=5e-3, weight_decay=0.01)
    with torch.no_grad():
        ctx.copy_(tuned)
        expected = (model.logit_scale * features[:1] @ F.normalize(model.compute_text_features(), dim=-1).t())[0]
        ctx.copy_(start)
    # the trainer's episode
    with torch.no_grad():
        predicted = tpt.adapt_and_predict(views)
    last = tpt.tuning.last
    assert last["kept"].tolist() == kept.tolist()
    assert last["loss"].item() == pytest.approx(loss.item(), rel=1e-5)
    torch.testing.assert_close(last["tuned"]["prompt_learner.ctx"], tuned, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(tuned, start)
    torch.testing.assert_close(predicted, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.prompt_learner.ctx, start) and not model.prompt_learner.ctx.requires_grad


def test_cocoop_tunes_the_image_context_and_keeps_ctx_and_meta_net(data_root, tiny_clip_files, tmp_path):
    tpt = make_tpt(data_root, tiny_clip_files, tmp_path, "synthetic_cocoop.yaml")
    before = copy.deepcopy(tpt.model.prompt_learner.state_dict())
    tpt.start_episodes()
    views = first_views(tpt)
    with torch.no_grad():
        predicted = tpt.adapt_and_predict(views)
        prompts = tpt.model.prompt_learner
        initial = prompts.ctx + prompts.meta_net(tpt.model.clip.encode_image(views[:1]))  # unnormalised f_0
    tuned = tpt.tuning.last["tuned"]["context"]
    step = (tuned - initial * (1 - 5e-3 * 0.01)).abs()
    assert step.max().item() == pytest.approx(5e-3, rel=1e-3)  # Adam's first step moves every entry by ~lr
    for name, value in prompts.state_dict().items():
        assert torch.equal(value, before[name])
    with torch.no_grad():
        features = F.normalize(tpt.model.clip.encode_image(views[:1]), dim=-1)
        classes = torch.arange(3)
        text = F.normalize(tpt.model.encode_pairs(tuned.expand(3, -1, -1), classes), dim=-1)
    torch.testing.assert_close(predicted, (tpt.model.logit_scale * features @ text.t())[0], rtol=1e-5, atol=1e-5)


def test_maple_selection_pass_gives_the_single_pass_step(data_root, tiny_clip_files, tmp_path):
    """Selecting without gradient and scoring the kept views again = upstream's one pass over every view."""
    tpt = make_tpt(data_root, tiny_clip_files, tmp_path, "synthetic_maple.yaml")
    tpt.start_episodes()
    views = first_views(tpt)
    reference = copy.deepcopy(tpt.model)
    prompts = reference.prompt_learner
    for parameter in prompts.parameters():
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW(prompts.parameters(), lr=0.04, weight_decay=0.01)
    logits = reference.logit_scale * reference.image_features(views) @ F.normalize(
        reference.compute_text_features(), dim=-1).t()
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    entropy_of_mean(logits[entropy.argsort()[:2]]).backward()
    optimizer.step()
    with torch.no_grad():
        expected = reference.logit_scale * reference.image_features(views[:1]) @ F.normalize(
            reference.compute_text_features(), dim=-1).t()
        start = {name: value.clone() for name, value in tpt.model.prompt_learner.state_dict().items()}
        predicted = tpt.adapt_and_predict(views)
    torch.testing.assert_close(predicted, expected[0], rtol=1e-4, atol=1e-5)
    tuned = tpt.tuning.last["tuned"]
    assert {name[len("prompt_learner."):] for name in tuned} == {name for name, _ in prompts.named_parameters()}
    assert all(not torch.allclose(value, start[name[len("prompt_learner."):]]) for name, value in tuned.items())
    for name, value in tpt.model.prompt_learner.state_dict().items():
        assert torch.equal(value, start[name])


def test_coop_tpt_starts_every_episode_from_the_source_context(data_root, tiny_clip_files, tmp_path):
    coop = build_trainer(toy_pets_cfg("CoOp", "CoOp/toy.yaml", data_root, str(tmp_path / "coop"), tiny_clip_files,
                                      "OPTIM.MAX_EPOCH", "1"))
    coop.train()
    trained = coop.model.prompt_learner.ctx.detach().clone()
    tpt = make_tpt(data_root, tiny_clip_files, tmp_path / "tpt")
    assert not torch.allclose(tpt.model.prompt_learner.ctx, trained)
    tpt.load_model(str(tmp_path / "coop"), epoch=1)
    accuracy = tpt.test()
    assert 0 <= accuracy <= 100 and tpt.last_test["num_samples"] == 6
    assert torch.equal(tpt.tuning.start["ctx"], trained) and torch.equal(tpt.model.prompt_learner.ctx, trained)
    assert tpt.throughput["images"] == 6


def test_config_checks(data_root, tiny_clip_files, tmp_path):
    with pytest.raises(ConfigError, match="TRAINER.TPT.PROMPT"):
        make_tpt(data_root, tiny_clip_files, tmp_path, "synthetic.yaml", "TRAINER.TPT.PROMPT", "vpt")
    with pytest.raises(ConfigError, match="TRAINER.TPT.SELECTION"):
        make_tpt(data_root, tiny_clip_files, tmp_path, "synthetic.yaml", "TRAINER.TPT.SELECTION", "0.1")
    assert math.isclose(make_tpt(data_root, tiny_clip_files, tmp_path).cfg.TRAINER.TPT.LR, 5e-3)


def test_an_fp16_episode_scales_its_loss_on_the_trainer_device(data_root, tiny_clip_files, tmp_path, monkeypatch):
    """PREC fp16 (with TRAIN.CPU_AUTOCAST on the CPU): each episode's GradScaler is made for the
    device the prompt is on and is enabled (one made for CUDA disables itself off CUDA)."""
    made = []

    class RecordedScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    tpt = make_tpt(data_root, tiny_clip_files, tmp_path, "synthetic.yaml", "TRAINER.TPT.PREC", "fp16",
                   "TRAIN.CPU_AUTOCAST", "True")
    assert tpt.amp.dtype == torch.float16 and tpt.amp.scaler is not None
    monkeypatch.setattr(torch.amp, "GradScaler", RecordedScaler)
    tpt.start_episodes()
    logits = tpt.adapt_and_predict(first_views(tpt))
    assert torch.isfinite(logits).all()
    assert len(made) == 1 and made[0].is_enabled() and made[0]._device == "cpu"
    assert made[0].get_scale() == 1000.0  # the episode's one step did not overflow
