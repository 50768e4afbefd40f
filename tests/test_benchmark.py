"""tools/benchmark.py: a case for every registered trainer, a loud failure without one, and the
JSON record of a run on the tiny CLIP (issue 10)."""
import copy
import json
import os
import sys

import pytest

import trainers  # noqa: F401  (registers the trainers)
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import benchmark  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_registered_trainer_has_a_case_with_an_existing_config():
    """Trainers that test files register for themselves (e.g. test_reliability's toy trainer) are not counted."""
    assert "CoOp" in benchmark.project_trainers() and "DeAR" in benchmark.project_trainers()
    benchmark.check_coverage(benchmark.project_trainers())
    for case in benchmark.CASES:
        assert case.trainer in TRAINER_REGISTRY, case
        assert os.path.isfile(os.path.join(ROOT, "configs", "trainers", case.config)), case
        assert case.kind in (benchmark.TRAIN, benchmark.CACHED, benchmark.EVAL_ONLY, benchmark.TEST_TIME)
    names = [case.name for case in benchmark.CASES]
    assert len(names) == len(set(names))


def test_issue_targets_are_in_the_table():
    targets = {case.name: (case.train_target, case.eval_target) for case in benchmark.CASES}
    assert targets["CoOp"] == (2.6, 1.15)
    assert targets["CoCoOp"] == (8.5, 4.0)
    assert targets["IVLP"][0] == 3.3 and targets["MaPLe"][0] == 3.5 and targets["PromptSRC"][0] == 4.0
    assert targets["DeAR"][0] == 2.2
    assert targets["RAda"][0] == 0.05
    cocoop = next(case for case in benchmark.CASES if case.name == "CoCoOp")
    assert cocoop.batch == 1


def test_a_registered_trainer_without_a_case_stops_the_benchmark(monkeypatch, capsys):
    class UncoveredBenchmarkTrainer(ClipTrainer):
        pass

    UncoveredBenchmarkTrainer.__module__ = "trainers.uncovered"  # as if it were a new file in trainers/
    # Registered for this test only (monkeypatch removes the entry afterwards).
    monkeypatch.setitem(TRAINER_REGISTRY._obj_map, "UncoveredBenchmarkTrainer", UncoveredBenchmarkTrainer)
    assert "UncoveredBenchmarkTrainer" in benchmark.project_trainers()
    assert benchmark.main(["--trainers", "CoOp"]) == 2
    error = capsys.readouterr().err
    assert "without a benchmark case: UncoveredBenchmarkTrainer" in error
    assert "CASES of tools/benchmark.py" in error


def test_a_case_for_an_unregistered_trainer_is_reported():
    with pytest.raises(benchmark.BenchmarkCoverageError, match="not registered: Gone"):
        benchmark.check_coverage(["CoOp"], [benchmark.Case("CoOp", "CoOp", "CoOp/vit_b16.yaml", benchmark.TRAIN),
                                            benchmark.Case("Gone", "Gone", "CoOp/vit_b16.yaml", benchmark.TRAIN)])


def test_selection_by_trainer_or_case_name():
    assert [case.name for case in benchmark.select_cases(["RAda"])] == ["RAda", "RAda (images)"]
    assert [case.name for case in benchmark.select_cases(["RAda (images)"])] == ["RAda (images)"]
    with pytest.raises(SystemExit, match="unknown trainer"):
        benchmark.select_cases(["NoSuchTrainer"])


@pytest.fixture(scope="module")
def tiny_run(tiny_clip_files, tmp_path_factory):
    """The JSON report of an in-process run of four cases on the tiny CLIP (32 px); torch's
    thread count is left as it is (--threads 0) for the tests that follow."""
    config, weights = tiny_clip_files
    path = tmp_path_factory.mktemp("benchmark") / "run.json"
    argv = ["--backbone", config, "--weights", weights, "--image-size", "32", "--classes", "6",
            "--trainers", "CoOp", "RAda", "ZeroshotCLIP", "RAdaTTT", "--rounds", "1", "--warmup", "0",
            "--clock", "cpu", "--threads", "0", "--in-process", "--json", str(path), "TRAINER.RADATTT.NUM_VIEWS", "10"]
    assert benchmark.main(argv) == 0
    with open(path) as file:
        return json.load(file)


def test_json_records_plausible_values(tiny_run):
    report = tiny_run
    records = {record["case"]: record for record in report["results"]}
    assert list(records) == ["ZeroshotCLIP", "CoOp", "RAda", "RAda (images)", "RAdaTTT"]
    assert report["settings"]["classes"] == 6 and report["settings"]["clock"] == "cpu"
    assert report["commit"] and len(report["load_before"]) == 3
    for record in records.values():
        assert record["frozen"]["wall_ms"] > 0 and record["frozen"]["cpu_ms"] > 0
        assert record["peak_memory_mib"] > 0 and record["memory_kind"] == "process peak RSS"
        evaluation = record["eval"]
        assert evaluation["wall_ms"] > 0 and evaluation["images_per_s"] > 0 and evaluation["ratio"] > 0
        assert len(record["rounds"]["frozen"]["cpu"]) == 1
        expected = statistics_ratio(record, "eval")
        assert evaluation["ratio"] == pytest.approx(expected)
    assert records["ZeroshotCLIP"]["train"] is None and records["RAdaTTT"]["train"] is None
    for name in ("CoOp", "RAda", "RAda (images)"):
        train = records[name]["train"]
        assert train["wall_ms"] > 0 and train["images"] == 4
        assert train["images_per_s"] == pytest.approx(4 / (train["wall_ms"] / 1000))
        assert train["ratio"] == pytest.approx(statistics_ratio(records[name], "train"))
    assert records["CoOp"]["train"]["target"] == 2.6
    assert records["CoOp"]["train"]["passed"] == (records["CoOp"]["train"]["ratio"] <= 2.6)
    assert records["RAda"]["train"]["target"] == 0.05 and records["RAda"]["kind"] == "cached"
    assert records["RAdaTTT"]["eval"]["frozen_batch"] == 10 and records["RAdaTTT"]["eval"]["images"] == 1
    assert records["CoOp"]["text_per_evaluation_ratio"] is not None


def statistics_ratio(record, name):
    """The ratio recomputed from the stored rounds (median of the CPU times)."""
    import statistics

    reference = "frozen eval" if name == "eval" and "frozen eval" in record["rounds"] else "frozen"
    return statistics.median(record["rounds"][name]["cpu"]) / statistics.median(record["rounds"][reference]["cpu"])


def test_learnable_parameters_are_those_the_trainer_optimises(tiny_run, tmp_path):
    report = tiny_run
    records = {record["case"]: record for record in report["results"]}
    settings = dict(report["settings"])
    for name in ("CoOp", "RAda"):
        case = next(case for case in benchmark.CASES if case.name == name)
        trainer = benchmark.build_trainer(case, settings, str(tmp_path))
        optimised = {id(param): param.numel() for optim in trainer._optims.values() if optim is not None
                     for group in optim.param_groups for param in group["params"]}
        assert records[name]["learnable_params"] == sum(optimised.values()) > 0
    assert records["CoOp"]["learnable_params"] == 4 * 32  # 4 context vectors of the tiny text width
    assert records["ZeroshotCLIP"]["learnable_params"] == 0


def test_table_marks_targets(tiny_run):
    report = tiny_run
    rows = {row[0]: row for row in benchmark.table_rows(report["results"])}
    assert len(rows["CoOp"]) == len(benchmark.HEADERS)
    records = {record["case"]: record for record in report["results"]}
    verdict = {True: "pass", False: "FAIL"}
    assert rows["CoOp"][6] == f"<= 2.6 {verdict[records['CoOp']['train']['ratio'] <= 2.6]}"
    assert rows["ZeroshotCLIP"][3] == ""
    assert rows["ZeroshotCLIP"][10] == f"<= 1.15 {verdict[records['ZeroshotCLIP']['eval']['ratio'] <= 1.15]}"
    assert rows["RAdaTTT"][10] == ""
    slow = copy.deepcopy(records["CoOp"])
    slow["train"].update(ratio=3.0, passed=False)
    fast = copy.deepcopy(records["CoOp"])
    fast["train"].update(ratio=1.0, passed=True)
    assert [row[6] for row in benchmark.table_rows([slow, fast])] == ["<= 2.6 FAIL", "<= 2.6 pass"]


def test_saved_run_is_shown_and_compared(tiny_run, tmp_path, capsys):
    report = tiny_run
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(report))
    assert benchmark.main(["--show", str(path), "--compare", str(path), "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert "| CoOp " in out and "Cost ratios:" in out
    rows = {row[0]: row for row in benchmark.comparison_rows(report["results"], report["results"])}
    assert rows["CoOp"][1] == rows["CoOp"][2] != "" and rows["ZeroshotCLIP"][1] == ""
    assert rows["RAdaTTT"][3] == rows["RAdaTTT"][4] != ""


def test_trainers_registered_by_tests_are_not_counted(monkeypatch):
    class ScriptTrainer(ClipTrainer):
        pass

    monkeypatch.setitem(TRAINER_REGISTRY._obj_map, "ScriptTrainer", ScriptTrainer)  # module: this test file
    assert "ScriptTrainer" in TRAINER_REGISTRY.registered_names()
    assert "ScriptTrainer" not in benchmark.project_trainers()
    benchmark.check_coverage(benchmark.project_trainers())


def test_a_case_measured_in_its_own_process_gives_the_in_process_record(tiny_run):
    """The default mode: each case in a fresh process (--worker), its record read back as JSON."""
    report = tiny_run
    in_process = next(record for record in report["results"] if record["case"] == "ZeroshotCLIP")
    case = next(case for case in benchmark.CASES if case.name == "ZeroshotCLIP")
    record = benchmark.run_in_subprocess(case, report["settings"])
    assert "error" not in record, record
    assert set(record) == set(in_process)
    assert record["learnable_params"] == in_process["learnable_params"] == 0
    assert record["train"] is None and record["eval"]["images_per_s"] > 0
    assert record["peak_memory_mib"] > 0 and record["memory_kind"] == "process peak RSS"
