"""tools/benchmark.py trainers: a case for every registered trainer, a loud failure without one,
ratios and verdicts computed from the measured rounds, and the JSON report of a run on the tiny
CLIP."""
import copy
import json
import os
import statistics
from types import SimpleNamespace

import pytest
from forked_runs import run_module

import torch

import trainers  # noqa: F401  (registers the trainers)
from vlprompt_app.benchmarking import per_trainer, trainer_cases
from vlprompt_app.benchmarking.flops import count_flops, matmul_peak
from vlprompt_app.benchmarking.report import format_report
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import CACHED, EVAL_ONLY, KINDS, TEST_TIME, TRAIN, Case

from vlprompt_app.commands import benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_registered_trainer_has_a_case_with_an_existing_config():
    """Trainers that test files register for themselves (e.g. test_reliability's toy trainer) are not counted."""
    assert "CoOp" in trainer_cases.project_trainers() and "DeAR" in trainer_cases.project_trainers()
    trainer_cases.check_coverage(trainer_cases.project_trainers())
    cases = trainer_cases.declared_cases()
    for case in cases:
        assert case.trainer in TRAINER_REGISTRY, case
        assert os.path.isfile(os.path.join(ROOT, "configs", "trainers", case.config)), case
        assert case.kind in KINDS
    names = [case.name for case in cases]
    assert len(names) == len(set(names))
    assert {case.trainer for case in cases} == set(trainer_cases.project_trainers())


def test_a_case_takes_its_trainer_and_name_from_the_declaring_class():
    """Declared in the class body: the row is named after the trainer unless it names itself, a
    subclass does not inherit its parent's rows, and a kind that is not one of KINDS is refused."""
    coop, = trainer_cases.cases_of("CoOp")
    assert (coop.trainer, coop.name, coop.config, coop.kind) == ("CoOp", "CoOp", "CoOp/vit_b16_ep50_ctxv1.yaml", TRAIN)
    assert [(case.trainer, case.name) for case in trainer_cases.cases_of("RAda")] == [
        ("RAda", "RAda"), ("RAda", "RAda (images)")]
    assert [case.kind for case in trainer_cases.cases_of("ZeroshotCLIP2")] == [EVAL_ONLY]
    assert [case.kind for case in trainer_cases.cases_of("LP")] == [CACHED]  # not FT's TRAIN, which LP subclasses
    assert trainer_cases.cases_of("PromptAlign")[0].kind == TEST_TIME
    with pytest.raises(ValueError, match="kind 'training' is not one of"):
        Case("CoOp/vit_b16.yaml", "training")


def made_up_times(frozen, train, eval_first, evaluation):
    """time_rounds' output for made-up CPU seconds per round (wall clock twice the CPU time)."""
    def part(cpu):
        return {"wall": [2 * value for value in cpu], "cpu": list(cpu)}

    return {"frozen": part(frozen), "train": part(train), "eval first": part(eval_first), "eval": part(evaluation)}


COUNTS = {"frozen": 4, "train": 4, "eval first": 4, "eval": 4}
REFERENCES = {"train": "frozen", "eval first": "frozen", "eval": "frozen"}


def test_ratios_are_the_medians_of_the_rounds_on_the_chosen_clock():
    case = Case("CoOp/vit_b16.yaml", TRAIN, name="Made up", trainer="CoOp", train_target=2.6, official_train=5.2)
    times = made_up_times(frozen=[1.0, 9.0, 2.0], train=[4.0, 5.0, 100.0], eval_first=[3.0, 3.0, 3.0],
                          evaluation=[2.2, 2.0, 2.4])
    fields = per_trainer.timing_fields(case, "cpu", times, COUNTS, REFERENCES)
    assert fields["train"]["ratio"] == pytest.approx(5.0 / 2.0)  # medians, so the 100 s outlier is ignored
    assert fields["train"]["cpu_ms"] == pytest.approx(5000.0) and fields["train"]["wall_ms"] == pytest.approx(10000.0)
    assert fields["train"]["images_per_s"] == pytest.approx(4 / 10.0)  # images per wall-clock second
    assert fields["train"]["passed"] is True and fields["train"]["official_ratio"] == 5.2
    assert fields["eval"]["ratio"] == pytest.approx(2.2 / 2.0) and fields["eval"]["passed"] is True
    assert fields["text_per_evaluation_ratio"] == pytest.approx(3.0 / 2.0 - 2.2 / 2.0)
    assert fields["frozen"]["cpu_ms"] == pytest.approx(2000.0)
    slower = made_up_times(frozen=[2.0], train=[5.3], eval_first=[3.0], evaluation=[2.4])
    failed = per_trainer.timing_fields(case, "cpu", slower, COUNTS, REFERENCES)
    assert failed["train"]["ratio"] == pytest.approx(2.65) and failed["train"]["passed"] is False
    assert failed["eval"]["ratio"] == pytest.approx(1.2) and failed["eval"]["passed"] is False
    slower_record = {**record_of(case, failed), "case": "Slower"}
    rows = {row[0]: row for row in per_trainer.table_rows([record_of(case, fields), slower_record])}
    assert rows["Made up"][6] == "<= 2.6 pass" and rows["Slower"][6] == "<= 2.6 FAIL"
    assert rows["Made up"][10] == "<= 1.15 pass" and rows["Slower"][10] == "<= 1.15 FAIL"


def test_the_wall_clock_gives_its_own_ratios():
    case = Case("CoOp/vit_b16.yaml", TRAIN, name="Made up", trainer="CoOp", train_target=2.6)
    times = made_up_times(frozen=[1.0], train=[2.0], eval_first=[1.0], evaluation=[1.0])
    times["frozen"]["wall"] = [4.0]  # the wall clock saw another job during the frozen forward
    fields = per_trainer.timing_fields(case, "wall", times, COUNTS, REFERENCES)
    assert fields["train"]["ratio"] == pytest.approx(4.0 / 4.0)
    assert per_trainer.timing_fields(case, "cpu", times, COUNTS, REFERENCES)["train"]["ratio"] == pytest.approx(2.0)


def record_of(case, fields):
    """A record as measure_case builds it, around made-up timing fields."""
    return {"case": case.name, "batch": 4, "learnable_params": 1, "peak_memory_mib": 1.0, **fields}


def test_a_registered_trainer_without_a_case_stops_the_benchmark(monkeypatch, capsys):
    class UncoveredBenchmarkTrainer(ClipTrainer):
        pass

    UncoveredBenchmarkTrainer.__module__ = "trainers.uncovered"  # as if it were a new file in trainers/
    # Registered for this test only (monkeypatch removes the entry afterwards).
    monkeypatch.setitem(TRAINER_REGISTRY._obj_map, "UncoveredBenchmarkTrainer", UncoveredBenchmarkTrainer)
    assert "UncoveredBenchmarkTrainer" in trainer_cases.project_trainers()
    assert benchmark.main(["trainers", "--trainers", "CoOp"]) == 2
    error = capsys.readouterr().err
    assert "without a benchmark case: UncoveredBenchmarkTrainer" in error
    assert "Declare benchmark_cases in the trainer's class body" in error


def test_selection_by_trainer_or_case_name():
    assert [case.name for case in trainer_cases.select_cases(["RAda"])] == ["RAda", "RAda (images)"]
    assert [case.name for case in trainer_cases.select_cases(["RAda (images)"])] == ["RAda (images)"]
    with pytest.raises(SystemExit, match="unknown trainer"):
        trainer_cases.select_cases(["NoSuchTrainer"])


@pytest.fixture(scope="module")
def tiny_run(tiny_clip_files, tmp_path_factory):
    """The JSON report of an in-process run of four cases on the tiny CLIP (32 px); torch's
    thread count is left as it is (--threads 0) for the tests that follow."""
    config, weights = tiny_clip_files
    path = tmp_path_factory.mktemp("benchmark") / "run.json"
    argv = ["trainers", "--backbone", config, "--weights", weights, "--image-size", "32", "--classes", "6",
            "--trainers", "CoOp", "RAda", "LP", "ZeroshotCLIP", "RAdaTTT", "--rounds", "1", "--warmup", "0",
            "--clock", "cpu", "--threads", "0", "--in-process", "--peak-size", "64", "--peak-repeats", "2",
            "--json", str(path), "TRAINER.RADATTT.NUM_VIEWS", "10"]
    assert benchmark.main(argv) == 0
    with open(path) as file:
        return json.load(file)


def test_json_records_plausible_values(tiny_run):
    report = tiny_run
    records = {record["case"]: record for record in report["results"]}
    assert sorted(records) == ["CoOp", "LP", "RAda", "RAda (images)", "RAdaTTT", "ZeroshotCLIP"]
    # in the order the trainers declare them (the registry's)
    assert list(records) == [case.name for case in
                             trainer_cases.select_cases(["CoOp", "RAda", "LP", "ZeroshotCLIP", "RAdaTTT"])]
    assert report["benchmark"] == "trainers"
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
    reference = "frozen eval" if name == "eval" and "frozen eval" in record["rounds"] else "frozen"
    return statistics.median(record["rounds"][name]["cpu"]) / statistics.median(record["rounds"][reference]["cpu"])


def test_learnable_parameters_are_those_the_trainer_optimises(tiny_run, tmp_path):
    report = tiny_run
    records = {record["case"]: record for record in report["results"]}
    settings = dict(report["settings"])
    for name in ("CoOp", "RAda"):
        case = trainer_cases.case_named(name)
        trainer = trainer_cases.build_trainer(case, settings, str(tmp_path))
        optimised = {id(param): param.numel() for optim in trainer._optims.values() if optim is not None
                     for group in optim.param_groups for param in group["params"]}
        assert records[name]["learnable_params"] == sum(optimised.values()) > 0
    assert records["CoOp"]["learnable_params"] == 4 * 32  # 4 context vectors of the tiny text width
    assert records["ZeroshotCLIP"]["learnable_params"] == 0
    # a test-time case counts what an episode tunes (its model's parameters stay frozen): RAda-TTT's generator
    case = trainer_cases.case_named("RAdaTTT")
    trainer = trainer_cases.build_trainer(case, settings, str(tmp_path))
    generator = sum(param.numel() for param in trainer.model.mask_generator.parameters())
    assert records["RAdaTTT"]["learnable_params"] == trainer.episode_learnable() == generator > 0


def test_table_marks_targets(tiny_run):
    report = tiny_run
    rows = {row[0]: row for row in per_trainer.table_rows(report["results"])}
    assert len(rows["CoOp"]) == len(per_trainer.HEADERS)
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
    assert [row[6] for row in per_trainer.table_rows([slow, fast])] == ["<= 2.6 FAIL", "<= 2.6 pass"]


def test_saved_run_is_shown_and_compared(tiny_run, tmp_path, capsys):
    report = tiny_run
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(report))
    assert benchmark.main(["show", str(path), "--compare", str(path), "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert "| CoOp " in out and "Cost ratios:" in out
    rows = {row[0]: row for row in per_trainer.comparison_rows(report["results"], report["results"])}
    assert rows["CoOp"][1] == rows["CoOp"][2] != "" and rows["ZeroshotCLIP"][1] == ""
    assert rows["RAdaTTT"][3] == rows["RAdaTTT"][4] != ""


def test_trainers_registered_by_tests_are_not_counted(monkeypatch):
    class ScriptTrainer(ClipTrainer):
        pass

    monkeypatch.setitem(TRAINER_REGISTRY._obj_map, "ScriptTrainer", ScriptTrainer)  # module: this test file
    assert "ScriptTrainer" in TRAINER_REGISTRY.registered_names()
    assert "ScriptTrainer" not in trainer_cases.project_trainers()
    trainer_cases.check_coverage(trainer_cases.project_trainers())


@pytest.mark.e2e  # a case measured in a process of its own (the forkserver's start: about 6 s of CPU)
def test_a_case_measured_in_its_own_process_gives_the_in_process_record(tiny_run, monkeypatch):
    """The default mode: each case in a process of its own (``python -m ...per_trainer``), its record read
    back as JSON; here the process is forked from tests/forked_runs.py's forkserver, not a new interpreter."""
    monkeypatch.setattr(per_trainer, "subprocess", SimpleNamespace(run=run_module))
    report = tiny_run
    in_process = next(record for record in report["results"] if record["case"] == "ZeroshotCLIP")
    case = trainer_cases.case_named("ZeroshotCLIP")
    record = per_trainer.run_in_subprocess(case, report["settings"])
    assert "error" not in record, record
    assert set(record) == set(in_process)
    assert record["learnable_params"] == in_process["learnable_params"] == 0
    assert record["train"] is None and record["eval"]["images_per_s"] > 0
    assert record["peak_memory_mib"] > 0 and record["memory_kind"] == "process peak RSS"


# --------------------------------------------------------------------------- distance to the hardware limit

def test_a_matmul_counts_two_flops_per_multiply_add_and_the_peak_is_its_best_time():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert count_flops({"mm": lambda: a @ b})["mm"] == 2 * 3 * 7 * 5
    peak = matmul_peak(torch.device("cpu"), torch.float32, size=64, repeats=3)
    square = torch.randn(64, 64)
    assert peak["flops"] == 2 * 64 ** 3 == count_flops({"mm": lambda: square @ square})["mm"]
    assert (peak["size"], peak["repeats"], peak["dtype"]) == (64, 3, "float32")
    for clock in ("wall", "cpu"):
        assert peak["best_s"][clock] > 0
        assert peak["flops_per_s"][clock] == peak["flops"] / peak["best_s"][clock]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_peak_is_measured_in_the_steps_dtype():
    peak = matmul_peak(torch.device("cuda"), torch.float16, size=1024, repeats=3)
    assert peak["dtype"] == "float16" and peak["flops"] == 2 * 1024 ** 3
    assert peak["flops_per_s"]["wall"] == peak["flops"] / peak["best_s"]["wall"] > 0


def test_a_linear_probe_step_counts_its_head_forward_and_weight_gradient(tiny_run, tmp_path):
    """LP trains its head [K, E] on cached features [B, E] that need no gradient: 2*B*E*K FLOPs
    forward (the product) and 2*B*E*K backward (the weight's gradient), nothing else counted."""
    record = next(record for record in tiny_run["results"] if record["case"] == "LP")
    trainer = trainer_cases.build_trainer(trainer_cases.case_named("LP"), dict(tiny_run["settings"]), str(tmp_path))
    classes, width = trainer.model.head.weight.shape
    assert classes == 6
    assert record["flops"]["train"] == 2 * (2 * record["batch"] * width * classes)
    # a frozen forward is evaluated with the same image encoder: the steady evaluation batch does
    # the frozen forward's products plus the head's
    assert record["flops"]["eval"] == record["flops"]["frozen"] + 2 * record["batch"] * width * classes


def test_every_measured_part_has_its_flops_and_the_peak_in_the_steps_dtype(tiny_run):
    records = {record["case"]: record for record in tiny_run["results"]}
    for record in records.values():
        assert record["matmul_peak"]["dtype"] == "float32" and record["matmul_peak"]["size"] == 64
        assert set(record["flops"]) == set(record["rounds"])  # every timed part, counted
        assert record["flops"]["frozen"] > 0 and record["flops"]["eval"] > 0
    coop = records["CoOp"]["flops"]
    assert coop["eval first"] > coop["eval"]  # the first batch also encodes the class text
    assert coop["train"] > coop["frozen"]  # the step's forward alone encodes the images and the class text


def made_up_limit_record(flops, cpu_ms, wall_ms, peak_cpu, peak_wall):
    """A record with the fields the distance-to-the-limit table reads."""
    record = {"case": "Made up", "batch": 4, "flops": flops,
              "matmul_peak": {"flops_per_s": {"cpu": peak_cpu, "wall": peak_wall}, "size": 2048, "repeats": 5,
                              "dtype": "float32"}}
    record.update({part: {"cpu_ms": cpu_ms[part], "wall_ms": wall_ms[part]} for part in cpu_ms})
    return record


def test_the_fraction_of_the_peak_is_flops_over_time_over_the_peak_on_the_reports_clock():
    record = made_up_limit_record({"frozen": 1e9, "train": 3e9, "eval first": 2e9, "eval": 1.2e9},
                                  cpu_ms={"frozen": 400.0, "train": 1500.0, "eval": 600.0},
                                  wall_ms={"frozen": 100.0, "train": 750.0, "eval": 300.0},
                                  peak_cpu=8e9, peak_wall=16e9)
    assert per_trainer.achieved(record, "train", "cpu") == pytest.approx((2e9, 0.25))  # 3 GFLOP in 1.5 CPU-s
    assert per_trainer.achieved(record, "train", "wall") == pytest.approx((4e9, 0.25))
    row, = per_trainer.limit_rows([record], "cpu")
    assert len(row) == len(per_trainer.LIMIT_HEADERS)
    assert dict(zip(per_trainer.LIMIT_HEADERS, row)) == {
        "case": "Made up", "B": 4, "train GFLOP": "3", "eval GFLOP": "1.2", "frozen GFLOP": "1", "peak GFLOP/s": "8",
        "train GFLOP/s": "2", "train % peak": "25", "eval GFLOP/s": "2", "eval % peak": "25", "frozen % peak": "31.2"}
    wall = dict(zip(per_trainer.LIMIT_HEADERS, per_trainer.limit_rows([record], "wall")[0]))
    assert wall["frozen % peak"] == "62.5"  # 10 GFLOP per wall-clock second, of 16
    evaluation_only = made_up_limit_record({"frozen": 1e9, "eval first": 1e9, "eval": 1e9},
                                           cpu_ms={"frozen": 100.0, "eval": 100.0},
                                           wall_ms={"frozen": 100.0, "eval": 100.0}, peak_cpu=1e10, peak_wall=1e10)
    evaluation_only["train"] = None
    row, = per_trainer.limit_rows([evaluation_only], "cpu")
    assert row[2] == row[6] == row[7] == "" and row[9] == "100"
    assert per_trainer.limit_rows([{"case": "Broken", "error": ["x"]}, {**record, "flops": None}], "cpu") == []


def test_the_report_prints_the_distance_to_the_limit(tiny_run):
    printed = format_report(tiny_run, per_trainer, "github")
    assert "Distance to the limit" in printed and "| train % peak " in printed
    assert "best of 2 64x64 float32 matmuls" in printed
    rows = {row[0]: row for row in per_trainer.limit_rows(tiny_run["results"], "cpu")}
    assert sorted(rows) == sorted(record["case"] for record in tiny_run["results"])
    coop = next(record for record in tiny_run["results"] if record["case"] == "CoOp")
    fraction = coop["flops"]["train"] / (coop["train"]["cpu_ms"] / 1000) / coop["matmul_peak"]["flops_per_s"]["cpu"]
    assert rows["CoOp"][7] == f"{100 * fraction:.3g}"
    assert f"| {rows['CoOp'][7]} " in printed.split("Distance to the limit")[1]
    assert rows["ZeroshotCLIP"][2] == "" and rows["ZeroshotCLIP"][3] != ""
    without = {**tiny_run, "results": [{**record, "flops": None, "matmul_peak": None}
                                       for record in tiny_run["results"]]}
    assert "Distance to the limit" not in format_report(without, per_trainer)


def test_synthetic_builds_every_case_from_its_synthetic_config_for_the_tiny_clip(tmp_path):
    """--synthetic: the tiny synthetic CLIP at 32 px unless given, each case from its synthetic
    config without ViT-B/16's targets; DeAR's ViT-B/16 config (its role map) does not fit that CLIP,
    its synthetic config does."""
    parser = benchmark.build_parser()
    settings = per_trainer.settings_of(parser.parse_args(["trainers", "--synthetic"]))
    assert (settings["backbone"], settings["weights"], settings["image_size"]) == (
        trainer_cases.SYNTHETIC_CLIP, trainer_cases.SYNTHETIC_WEIGHTS, 32)
    assert "configs/clip/tiny-synthetic-clip.json (weights/tiny-synthetic-clip.pt weights), 32 px" in \
        per_trainer.header_line(settings)
    assert "each case's synthetic config" in per_trainer.header_line(settings)
    given = per_trainer.settings_of(parser.parse_args(["trainers", "--synthetic", "--image-size", "64"]))
    assert given["image_size"] == 64 and given["backbone"] == trainer_cases.SYNTHETIC_CLIP
    plain = per_trainer.settings_of(parser.parse_args(["trainers"]))
    assert (plain["backbone"], plain["weights"], plain["image_size"], plain["synthetic"]) == (
        "ViT-B/16", "random", 224, False)
    dear = trainer_cases.synthetic_case(trainer_cases.case_named("DeAR"))
    assert (dear.config, dear.train_target, dear.eval_target) == ("DeAR/synthetic.yaml", None, None)
    assert trainer_cases.case_named("DeAR").train_target == 2.2
    settings.update(classes=4, rounds=1, warmup=0, threads=0, flops=False)
    record = per_trainer.measure_case(dear, settings)
    assert record["config"] == "configs/trainers/DeAR/synthetic.yaml" and record["train"]["ratio"] > 0
    assert record["train"]["target"] is None and record["flops"] is None


def test_compile_times_the_compiled_step_and_evaluation_in_the_eager_rounds(tiny_clip_files, tmp_path, capsys):
    """--compile BACKEND: the compiled calls join the same rounds (their medians next to the eager ones of
    the same record), dynamo's counts, and a trainer that refuses TRAIN.COMPILE says why."""
    from vlprompt.engine.test_time import TestTimeTrainer

    config, weights = tiny_clip_files
    path = tmp_path / "compiled.json"
    argv = ["trainers", "--backbone", config, "--weights", weights, "--image-size", "32", "--classes", "6",
            "--trainers", "LP", "RAdaTTT", "--rounds", "2", "--warmup", "0", "--clock", "cpu", "--threads", "0",
            "--in-process", "--no-flops", "--compile", "eager", "--json", str(path), "TRAINER.RADATTT.NUM_VIEWS", "10"]
    assert benchmark.main(argv) == 0
    printed = capsys.readouterr().out
    with open(path) as file:
        records = {record["case"]: record for record in json.load(file)["results"]}
    linear_probe = records["LP"]
    info = linear_probe["compile"]
    assert (info["backend"], info["mode"], info["methods"]) == ("eager", "default", ["forward", "forward_features", "loss"])
    assert info["graphs"] >= 2 and info["graph_breaks"] == 0 and info["compile_s"] > 0
    for part in ("train", "eval first", "eval"):
        assert len(linear_probe["rounds"][f"{part} compiled"]["cpu"]) == 2
        assert info[part]["compiled_ms"] == 1000 * statistics.median(linear_probe["rounds"][f"{part} compiled"]["cpu"])
    assert info["train"]["eager_ms"] == linear_probe["train"]["cpu_ms"]
    assert records["RAdaTTT"]["compile"] == {"backend": "eager", "refused": TestTimeTrainer.compile_refusal}
    assert "Compiled against eager: TRAIN.COMPILE eager (mode default), median ms" in printed
    assert f"Not compiled (RAdaTTT): {TestTimeTrainer.compile_refusal}" in printed
    lines = printed.splitlines()
    table = next(index for index, line in enumerate(lines) if line.startswith("Compiled against eager"))
    row = next(line for line in lines[table:] if line.startswith("LP "))
    speed_up = info["train"]["eager_ms"] / info["train"]["compiled_ms"]
    assert f"{info['train']['eager_ms']:.1f}" in row and f"{speed_up:.2f}" in row
