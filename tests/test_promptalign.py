"""PromptAlign: token statistics, the alignment loss, the block-input recorder, the statistics files."""
import pytest
import torch
from baseline_setup import tiny_node, tiny_runner, toy_world  # noqa: F401

from trainers.maple import MaPLeCLIP
from trainers.promptalign import (
    TokenStatistics, alignment_loss, load_source_statistics, recording_plan, token_statistics,
)
from vlprompt.clip import vision_prompt_plan
from vlprompt.config import ConfigError

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
