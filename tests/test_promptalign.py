"""PromptAlign: token statistics, the alignment loss, the block-input recorder, the statistics files."""
import shutil
from pathlib import Path

import pytest
import torch
from baseline_setup import build_seeded, make_cfg, tiny_node, tiny_runner, toy_world, toy_world_cfg  # noqa: F401

from trainers.promptalign import (
    TokenStatistics, alignment_loss, image_features_and_block_inputs, load_source_statistics, read_run_config,
    recording_plan, statistics_paths, token_statistics,
)
from vlprompt.clip import vision_prompt_plan
from vlprompt.config import ConfigError
from vlprompt.data import DataManager
from vlprompt.engine import build_trainer
from vlprompt.engine.run_folder import RunFolder
from vlprompt.engine.test_time import average_prediction_entropy, entropy_per_view
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.prompt_tuning import PromptTuning
from vlprompt.utils import read_image
from vlprompt_app.commands import promptalign_stats
from vlprompt_app.protocols.layout import parse_run_path, source_model_name, ttt_run_dir
from vlprompt_app.protocols.published import find_published, load_published, published_path


ROOT = Path(__file__).resolve().parents[1]
CLASSNAMES = ["abyssinian", "american bulldog", "bengal"]


def test_token_statistics_are_the_per_position_mean_and_biased_variance_over_views():
    tokens = torch.tensor([[[1.0, 2.0], [0.0, 4.0]], [[3.0, 2.0], [2.0, 0.0]]])  # [V=2, L=2, D=2]
    mean, variance = token_statistics(tokens)
    torch.testing.assert_close(mean, torch.tensor([[2.0, 2.0], [1.0, 2.0]]))
    torch.testing.assert_close(variance, torch.tensor([[1.0, 0.0], [1.0, 4.0]]))


def test_alignment_loss_is_half_the_mean_l1_of_means_plus_half_of_variances_summed_over_layers():
    source_means = torch.zeros(3, 2, 2)
    source_variances = torch.ones(3, 2, 2)
    statistics = {0: (torch.full((2, 2), 2.0), torch.full((2, 2), 3.0)),  # 0.5·2 + 0.5·2 = 2
                  1: (torch.tensor([[4.0, 0.0], [0.0, 0.0]]), torch.ones(2, 2))}  # 0.5·1 + 0 = 0.5
    assert alignment_loss(statistics, source_means, source_variances).item() == pytest.approx(2.5)
    # layer 2 of the source statistics is not read when it is not aligned
    source_means[2] = 100.0
    assert alignment_loss(statistics, source_means, source_variances).item() == pytest.approx(2.5)


def test_running_statistics_over_batches_equal_those_of_the_whole_set():
    torch.manual_seed(0)
    tokens = {0: torch.randn(11, 5, 4) * 3 + 1, 2: torch.randn(11, 5, 4)}
    running = TokenStatistics()
    for start, stop in ((0, 4), (4, 5), (5, 11)):
        running.add({layer: value[start:stop] for layer, value in tokens.items()})
    means, variances = running.result()
    assert means.shape == variances.shape == (2, 5, 4)
    for row, layer in enumerate((0, 2)):
        torch.testing.assert_close(means[row], tokens[layer].mean(0))
        torch.testing.assert_close(variances[row], tokens[layer].var(0, unbiased=False))


def test_recorded_block_inputs_hold_the_maple_prompts_and_leave_the_features_unchanged(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    model = MaPLeCLIP(runner, tokenizer, CLASSNAMES, tiny_node("MaPLe", PROMPT_DEPTH=2)).eval()
    images = torch.randn(3, 3, 32, 32)
    prompts = model.prompt_learner.vision_prompts()  # V_1, V_2 [2, 64]
    plan = vision_prompt_plan(prompts)
    recording, inputs = recording_plan(plan, [0, 1, 2])
    with torch.no_grad():
        features = runner.encode_image(images, recording)
        torch.testing.assert_close(features, runner.encode_image(images, plan))
        visual = runner.visual
        stem = visual.ln_pre(torch.cat([visual.embed(images), prompts[0].expand(3, -1, -1)], dim=1))
    assert sorted(inputs) == [0, 1, 2] and inputs[0].shape == (3, 1 + 16 + 2, 64)
    torch.testing.assert_close(inputs[0], stem)
    torch.testing.assert_close(inputs[1][:, -2:], prompts[1].expand(3, -1, -1))  # V_2 replaced the last two
    assert not torch.allclose(inputs[2][:, -2:], prompts[1].expand(3, -1, -1))  # block 2 carries them forward


def test_statistics_files_are_checked_against_the_model(tmp_path):
    means, variances = tmp_path / "m.pt", tmp_path / "v.pt"
    torch.save(torch.zeros(3, 19, 64), means)
    command = "python tools/promptalign_stats.py --model-dir RUN"
    with pytest.raises(ConfigError, match=r'variances ".*v.pt" do not exist.*promptalign_stats.py --model-dir RUN'):
        load_source_statistics(str(means), str(variances), (19, 64), [0, 1], command)
    torch.save(torch.ones(3, 19, 64), variances)
    loaded = load_source_statistics(str(means), str(variances), (19, 64), [0, 1], command)
    assert [tuple(value.shape) for value in loaded] == [(3, 19, 64)] * 2
    with pytest.raises(ConfigError, match=r"must be a tensor \[blocks > 1, 21, 64\].*got \(3, 19, 64\)"):
        load_source_statistics(str(means), str(variances), (21, 64), [0, 1], command)
    with pytest.raises(ConfigError, match=r"blocks > 3"):
        load_source_statistics(str(means), str(variances), (19, 64), [0, 3], command)


# ----------------------------------------------------------------------------- trainer and statistics tool

@pytest.fixture(scope="module")
def source_run(toy_world, tmp_path_factory):  # noqa: F811
    """A MaPLe run (1 epoch, prompts in 2 layers) on the toy world: its folder, as train.py writes it."""
    folder = tmp_path_factory.mktemp("maple_source")
    cfg = make_cfg(toy_world, "MaPLe", folder, subsample="all", OPTIM__MAX_EPOCH=1, OPTIM__WARMUP_EPOCH=0)
    RunFolder(str(folder)).write_config(cfg)
    build_seeded(cfg).train()
    return str(folder)


def promptalign(toy_world, output_dir, *opts):  # noqa: F811
    """PromptAlign's ViT-B/16 recipe on the toy world: the tiny CLIP (MaPLe depth 2), 8 views, 2 kept."""
    return build_trainer(toy_world_cfg(toy_world, "PromptAlign", "PromptAlign/vit_b16.yaml", output_dir,
                                       "TRAINER.MAPLE.PROMPT_DEPTH", "2", "TRAINER.TPT.NUM_VIEWS", "8",
                                       "TRAINER.TPT.SELECTION", "0.25", "TRAINER.PROMPTALIGN.PREC", "fp32",
                                       "DATALOADER.TEST.BATCH_SIZE", "2", *opts))


@pytest.fixture(scope="module")
def statistics(source_run):
    """The statistics tool run on the source run (all training images); their paths."""
    assert promptalign_stats.main(["--model-dir", source_run, "--batch-size", "3"]) == 0
    return statistics_paths(source_run)


def test_statistics_tool_writes_the_block_input_statistics_of_the_source_training_images(
        toy_world, source_run, statistics, tmp_path):  # noqa: F811
    means, variances = (torch.load(path, weights_only=True) for path in statistics)
    assert means.shape == variances.shape == (3, 1 + 16 + 2, 64)  # blocks, CLS + patches + 2 prompts, width
    trainer = promptalign(toy_world, tmp_path)
    trainer.load_model(source_run, epoch=1)
    source = DataManager(read_run_config(source_run))  # the source run's images and preprocessing
    images = torch.stack([source.test_loader.dataset.transform(read_image(item.impath))
                          for item in source.dataset.train_x])
    assert images.shape[0] == 5 * 4  # every training image of the source run's classes
    with torch.no_grad():
        _, inputs = image_features_and_block_inputs(trainer.model, images, [0, 2])
    for row, layer in ((0, 0), (2, 2)):
        torch.testing.assert_close(means[row], inputs[layer].mean(0))
        torch.testing.assert_close(variances[row], inputs[layer].var(0, unbiased=False), rtol=1e-4, atol=1e-6)


def test_missing_statistics_name_the_file_and_the_command(toy_world, source_run, tmp_path):  # noqa: F811
    trainer = promptalign(toy_world, tmp_path, "TRAINER.PROMPTALIGN.VIS_MEANS", str(tmp_path / "m.pt"),
                          "TRAINER.PROMPTALIGN.VIS_VARS", str(tmp_path / "v.pt"))
    trainer.load_model(source_run, epoch=1)
    with pytest.raises(ConfigError, match=rf'means ".*m.pt" do not exist.*promptalign_stats.py --model-dir {source_run}'):
        trainer.test()
    with pytest.raises(ConfigError, match="--model-dir"):
        promptalign(toy_world, tmp_path / "none").test()


def test_compute_stats_writes_the_tools_statistics_into_the_source_run(toy_world, source_run, statistics, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(source_run, run, ignore=shutil.ignore_patterns("promptalign_stats"))
    trainer = promptalign(toy_world, tmp_path / "ttt", "TRAINER.PROMPTALIGN.COMPUTE_STATS", "True")
    trainer.load_model(str(run), epoch=1)
    trainer.start_episodes()
    for computed, written in zip(statistics_paths(str(run)), statistics):
        torch.testing.assert_close(torch.load(computed, weights_only=True), torch.load(written, weights_only=True))


def test_one_step_minimises_entropy_plus_weighted_alignment_and_prompts_are_reset(
        toy_world, source_run, statistics, tmp_path):  # noqa: F811
    trainer = promptalign(toy_world, tmp_path)
    trainer.load_model(source_run, epoch=1)
    trainer.start_episodes()
    model, tuning = trainer.model, trainer.tuning
    start = {name: value.clone() for name, value in model.prompt_learner.state_dict().items()}
    views = next(iter(trainer.test_loader))["img"][0]  # [8, 3, 32, 32]
    with torch.no_grad():
        tuning(views)
    terms, last = tuning.terms, tuning.last
    assert sorted(last["tuned"]) == sorted(f"prompt_learner.{name}" for name in (
        "ctx", "compound_prompts_text.0", "proj.weight", "proj.bias", "compound_prompt_projections.0.weight",
        "compound_prompt_projections.0.bias"))  # T_1, T_2, F_1, F_2: every prompt-learner parameter
    for name, value in model.prompt_learner.state_dict().items():  # reset after the episode
        assert torch.equal(value, start[name])
    # by hand, with the starting prompts: the kept views, their block-0/1 statistics, both terms
    with torch.no_grad():
        text = torch.nn.functional.normalize(model.compute_text_features(), dim=-1)
        kept = entropy_per_view(model.cosine_logits(model.image_features(views), text)).argsort()[:2]
        features, inputs = image_features_and_block_inputs(model, views[kept], [0, 1])
        entropy = average_prediction_entropy(model.cosine_logits(torch.nn.functional.normalize(features, dim=-1), text))
    assert torch.equal(last["kept"], kept)
    alignment = 0.0
    for layer in (0, 1):
        mean, variance = inputs[layer].mean(0), inputs[layer].var(0, unbiased=False)
        torch.testing.assert_close(terms["statistics"][layer][0], mean)
        torch.testing.assert_close(terms["statistics"][layer][1], variance)
        alignment += 0.5 * (mean - tuning.source_means[layer]).abs().mean() \
            + 0.5 * (variance - tuning.source_variances[layer]).abs().mean()
    assert alignment.item() > 0
    assert terms["alignment"].item() == pytest.approx(100 / 3 * alignment.item(), rel=1e-5)
    assert last["loss"].item() == pytest.approx(entropy.item() + 100 / 3 * alignment.item(), rel=1e-5)
    # without the alignment the step is MaPLe+TPT's (TPT's PromptTuning on the same model); with it, not
    aligned = last["tuned"]
    tuning.weight = 0.0
    with torch.no_grad():
        tuning(views)
    tpt = PromptTuning(model, "maple", trainer.cfg.TRAINER.TPT, trainer.autocast)
    tpt.snapshot()
    with torch.no_grad():
        tpt(views)
    for name, value in tpt.last["tuned"].items():
        torch.testing.assert_close(tuning.last["tuned"][name], value)
    assert any(not torch.allclose(aligned[name], value) for name, value in tpt.last["tuned"].items())


def test_a_test_run_adapts_every_image(toy_world, source_run, statistics, tmp_path):  # noqa: F811
    trainer = promptalign(toy_world, tmp_path, "TRAINER.TPT.NUM_VIEWS", "4", "TRAINER.TPT.SELECTION", "0.5")
    trainer.load_model(source_run, epoch=1)
    accuracy = trainer.test("val")
    assert 0 <= accuracy <= 100 and trainer.last_test["num_samples"] == trainer.throughput["images"] == 5 * 2


def test_config_checks(toy_world, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match=r"ALIGN_LAYERS \[0, 3\]: the image tower .* has blocks 0..2"):
        promptalign(toy_world, tmp_path, "TRAINER.PROMPTALIGN.ALIGN_LAYERS", "[0, 3]")
    with pytest.raises(ConfigError, match="VIS_MEANS and VIS_VARS are given together"):
        promptalign(toy_world, tmp_path, "TRAINER.PROMPTALIGN.VIS_MEANS", "m.pt")
    with pytest.raises(ConfigError, match='TRAINER.TPT.PROMPT must be "maple"'):
        promptalign(toy_world, tmp_path, "TRAINER.TPT.PROMPT", "coop")


def test_the_protocol_run_layout_finds_the_published_row():
    """tools/run_protocol.py's folder of PromptAlign:vit_b16 from its MaPLe source is matched to RAda's
    Table 3 row PromptAlign (configs/published/ttt.yaml) by parse_results --published, TPT:vit_b16_maple's
    from the same source to the row MaPLe+TPT."""
    published = load_published(published_path("ttt", ROOT / "configs"), "ttt")
    key = parse_run_path(ttt_run_dir("", "PromptAlign", "vit_b16",
                                     source_model_name("MaPLe", "vit_b16_c2_ep5_batch4_2ctx_cross_datasets", 16),
                                     "imagenet_a", 1).parts)
    assert (key.trainer, key.cfg) == ("PromptAlign", "vit_b16@MaPLe-vit_b16_c2_ep5_batch4_2ctx_cross_datasets_16shots")
    entry = find_published(published, key.trainer, (key.cfg,))
    assert "row PromptAlign" in entry.source and entry.values["average"] == {"": 63.55}
    tpt_cfg = key.cfg.replace("vit_b16@", "vit_b16_maple@")
    assert "row MaPLe+TPT" in find_published(published, "TPT", (tpt_cfg,)).source
