"""tools/benchmark.py dear on the tiny synthetic CLIP: L_reg costs exactly its frozen branch,
that branch reuses the prompted pass's prefix and layer J's projections, and the
printed figures are computed from the measured rounds."""
import json
import os

import pytest
import torch

from vlprompt_app.benchmarking import dear
from vlprompt_app.benchmarking.flops import count_flops
from vlprompt_app.benchmarking.report import format_report

from vlprompt_app.commands import benchmark
from toy_images import quietly  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 2
ROUNDS = 2


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(settings, report, printed lines) of a CPU run on the synthetic DeAR config (32 px)."""
    path = tmp_path_factory.mktemp("benchmark_dear") / "dear.json"
    argv = ["dear", "--config-file", os.path.join(ROOT, "configs/trainers/DeAR/synthetic.yaml"), "--image-size", "32",
            "--batch", str(BATCH), "--classes", "6", "--rounds", str(ROUNDS), "--warmup", "0", "--flops",
            "--clock", "cpu", "--prec", "fp32", "--device", "cpu", "--threads", "0", "--json", str(path)]
    status, lines = quietly(lambda: benchmark.main(argv))
    assert status == 0
    report = json.loads(path.read_text())
    return report["settings"], report, "\n".join(lines)


@pytest.mark.slow  # reads the timed tool run of the module fixture
def test_every_case_is_timed_in_every_round(tiny_run):
    _, report, printed = tiny_run
    assert report["benchmark"] == "dear"
    records = {record["case"]: record for record in report["results"]}
    assert list(records) == ["frozen", "dear", "dear_noreg", "reg_branch"]
    for record in records.values():
        assert len(record["rounds"]["cpu"]) == len(record["rounds"]["wall"]) == ROUNDS
        assert min(record["rounds"]["cpu"]) > 0 and record["flops"] > 0
        assert record["min_ms"] <= record["ms"] <= record["max_ms"]
    assert records["frozen"]["ratio"] == 1.0
    assert printed.splitlines()[0].startswith("DeAR L_reg: ")


def made_up_records(ms, flops=None):
    """Records of records_from for rounds whose CPU times are ``ms`` (one round each)."""
    times = {name: {"wall": [2 * value / 1000], "cpu": [value / 1000]} for name, value in ms.items()}
    return dear.records_from(times, "cpu", BATCH, flops)


def test_summary_figures_come_from_the_medians():
    records = made_up_records({"frozen": 50.0, "dear": 120.0, "dear_noreg": 100.0, "reg_branch": 20.0},
                              flops={"frozen": 10, "dear": 23, "dear_noreg": 20, "reg_branch": 3})
    by_case = {record["case"]: record for record in records}
    assert by_case["dear"]["ratio"] == pytest.approx(2.4) and by_case["reg_branch"]["ratio"] == pytest.approx(0.4)
    assert by_case["dear"]["images_per_s"] == pytest.approx(BATCH / 0.24)  # wall clock
    lines = dear.summary_lines({"results": records})
    assert lines[0].startswith("L_reg adds 20.0 % to the training step")
    assert "its frozen branch alone is 20.0 % of the step without it and 0.40x a frozen CLIP forward" in lines[0]
    assert lines[1] == "training step / frozen CLIP forward: with L_reg 2.40x, without 2.00x"
    assert lines[2] == ("L_reg adds 15.0 % of the step's FLOPs; "
                        "step with L_reg = step without + frozen branch: yes")
    wasteful = made_up_records({"frozen": 50.0, "dear": 150.0, "dear_noreg": 100.0, "reg_branch": 20.0},
                               flops={"frozen": 10, "dear": 25, "dear_noreg": 20, "reg_branch": 3})
    lines = dear.summary_lines({"results": wasteful})
    assert lines[0].startswith("L_reg adds 50.0 % to the training step") and lines[2].endswith(": no")


@pytest.mark.slow  # reads the timed tool run of the module fixture
def test_printed_table_is_the_reports(tiny_run):
    _, report, printed = tiny_run
    assert format_report(report, dear) in printed


@pytest.mark.slow  # reads the timed tool run of the module fixture
def test_regulariser_costs_exactly_its_frozen_branch(tiny_run):
    """The step with L_reg does the FLOPs of the step without it plus those of the frozen branch:
    no second prefix, no second projection of layer J's input."""
    _, report, printed = tiny_run
    flops = {record["case"]: record["flops"] for record in report["results"]}
    assert flops["dear"] - flops["dear_noreg"] == flops["reg_branch"]
    assert 0 < flops["reg_branch"] < flops["frozen"] / 2  # layers 4..6 of 6, the last one for [CLS] only
    assert "step with L_reg = step without + frozen branch: yes" in printed


@pytest.mark.slow  # reads the timed tool run of the module fixture
def test_frozen_branch_skips_the_projections_it_shares(tiny_run):
    """Continuing from the SharedPrefix saves exactly layer J's q, k, v of the N original tokens."""
    settings, report, _ = tiny_run
    model, _, _ = dear.build_model(settings, 1.0, torch.device("cpu"))
    images = torch.randn(BATCH, 3, 32, 32)
    visual = model.clip.visual
    with torch.no_grad():
        hidden = visual.run_prefix(images, model.vision_block)
        unshared = count_flops(
            {"from_hidden": lambda: visual(hidden=hidden, start=model.vision_block, rows=[0])})["from_hidden"]
    tokens, width = hidden.shape[1], hidden.shape[2]
    branch = next(record["flops"] for record in report["results"] if record["case"] == "reg_branch")
    assert branch == unshared - 2 * BATCH * tokens * width * 3 * width


def test_a_missing_config_file_is_reported(tmp_path, capsys):
    assert benchmark.main(["dear", "--config-file", str(tmp_path / "nope.yaml"), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "nope.yaml" in error and "does not exist" in error


def test_default_settings_are_the_papers_vit_b16_config():
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    args = benchmark.build_parser().parse_args(["dear"])
    assert args.config_file == os.path.join(ROOT, "configs/trainers/DeAR/vit_b16_base2new.yaml")
    assert args.weights == "random" and args.batch == 16
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, args.config_file)
    assert cfg.MODEL.BACKBONE.NAME == "ViT-B/16"
    assert (cfg.TRAINER.DEAR.INJECT_LAYER, cfg.TRAINER.DEAR.LAMBDA_REG, len(cfg.TRAINER.DEAR.ATTRIBUTES)) == (9, 1.0, 5)
