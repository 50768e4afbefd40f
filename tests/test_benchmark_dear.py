"""tools/benchmark_dear.py on the tiny synthetic CLIP: L_reg costs exactly its frozen branch,
and that branch reuses the prompted pass's prefix and layer J's projections (issue 6)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import benchmark_dear  # noqa: E402
from toy_images import quietly  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 2


@pytest.fixture(scope="module")
def tiny_run():
    argv = ["--config-file", os.path.join(ROOT, "configs/trainers/DeAR/synthetic.yaml"), "--image-size", "32",
            "--batch", str(BATCH), "--num-classes", "6", "--rounds", "1", "--warmup", "0", "--flops",
            "--clock", "cpu", "--prec", "fp32", "--cpu", "--threads", "0"]
    args = benchmark_dear.build_parser().parse_args(argv)
    result, lines = quietly(lambda: benchmark_dear.main(args))
    return args, result, "\n".join(lines)


def test_every_case_is_timed_and_reported(tiny_run):
    _, result, printed = tiny_run
    median = result["median"]
    assert set(median) == {"frozen", "dear", "dear_noreg", "reg_branch"}
    assert all(seconds > 0 for seconds in median.values())
    assert f"L_reg adds {100 * (median['dear'] / median['dear_noreg'] - 1):.1f} % to the training step" in printed
    assert (f"training step / frozen CLIP forward: with L_reg {median['dear'] / median['frozen']:.2f}x, "
            f"without {median['dear_noreg'] / median['frozen']:.2f}x") in printed


def test_regulariser_costs_exactly_its_frozen_branch(tiny_run):
    """The step with L_reg does the FLOPs of the step without it plus those of the frozen branch:
    no second prefix, no second projection of layer J's input."""
    _, result, _ = tiny_run
    flops = result["flops"]
    assert flops["dear"] - flops["dear_noreg"] == flops["reg_branch"]
    assert 0 < flops["reg_branch"] < flops["frozen"] / 2  # layers 4..6 of 6, the last one for [CLS] only


def test_frozen_branch_skips_the_projections_it_shares(tiny_run):
    """Continuing from the SharedPrefix saves exactly layer J's q, k, v of the N original tokens."""
    args, result, _ = tiny_run
    dear, _, _ = benchmark_dear.build_model(args, 1.0, torch.device("cpu"))
    images = torch.randn(BATCH, 3, 32, 32)
    visual = dear.clip.visual
    with torch.no_grad():
        hidden = visual.run_prefix(images, dear.vision_block)
        unshared = benchmark_dear.count_flops(
            {"from_hidden": lambda: visual(hidden=hidden, start=dear.vision_block, rows=[0])})["from_hidden"]
    tokens, width = hidden.shape[1], hidden.shape[2]
    assert result["flops"]["reg_branch"] == unshared - 2 * BATCH * tokens * width * 3 * width


def test_a_missing_config_file_is_reported(tmp_path):
    args = benchmark_dear.build_parser().parse_args(["--config-file", str(tmp_path / "nope.yaml"), "--cpu"])
    with pytest.raises(benchmark_dear.ConfigError, match="does not exist"):
        benchmark_dear.main(args)


def test_default_settings_are_the_papers_vit_b16_config():
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    args = benchmark_dear.build_parser().parse_args([])
    assert args.config_file == os.path.join(ROOT, "configs/trainers/DeAR/vit_b16_base2new.yaml")
    assert args.weights == "random" and args.batch == 16
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, args.config_file)
    assert cfg.MODEL.BACKBONE.NAME == "ViT-B/16"
    assert (cfg.TRAINER.DEAR.INJECT_LAYER, cfg.TRAINER.DEAR.LAMBDA_REG, len(cfg.TRAINER.DEAR.ATTRIBUTES)) == (9, 1.0, 5)
