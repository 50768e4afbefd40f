"""tools/gpu_acceptance.py: the CPU rehearsal of the GPU acceptance run (every stage, tiny
settings), the stage time limits, the report's checks and tables, the data stage's loader
timing, the compiled stage's wiring, the carried folder and the official benchmark's options."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from forked_runs import forkserver_context, launch, run_script

from vlprompt_app.fidelity import cost
from vlprompt_app.fidelity.export import EXPORTED_COMMIT_FILE, export
from vlprompt_app.gpu_acceptance import data, prepare, report as acceptance_report, run, stages
from vlprompt_app.gpu_acceptance.checks import checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.e2e
def test_rehearsal_runs_every_stage_and_reports(tmp_path):
    """The command as typed (run as tests/forked_runs.py runs a script); its stages are processes
    forked from its own (run.ForkedCommand), each running its stage's command."""
    out = tmp_path / "acceptance"
    # a budget no loaded CI machine reaches: the stages' time limits are the GPU run's concern
    done = run_script([sys.executable, "tools/gpu_acceptance.py", "run", "--rehearsal", "--out", str(out),
                       "--official", str(tmp_path / "no_trees"), "--budget", "3600"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["acceptance.json", "acceptance.md", "compiled.jsonl", "cuda-tests.xml",
                                       "data.jsonl", "data_tree.json", "environment.json", "logs.txt",
                                       "parity.jsonl", "trainers.jsonl"]
    report = json.loads((out / "acceptance.json").read_text())
    stages = {stage["stage"]: stage for stage in report["stages"]}
    assert [stage["stage"] for stage in report["stages"]] == list(run.STAGES)
    assert all(stages[name]["exit_status"] == 0 and stages[name]["cpu_s"] > 0
               for name in ("environment", "cuda-tests", "parity", "data-tree", "data", "trainers", "compiled"))
    assert "no exported official tree" in stages["official"]["skipped"]
    coop, tpt = report["compiled"]  # CoOp's step and evaluation traced (eager backend), TPT refuses
    assert coop["case"] == "CoOp" and coop["graphs"] >= 2 and coop["graph_breaks"] == 0
    assert coop["eager"]["train"]["wall_ms"] > 0 and coop["compiled"]["eval"]["images_per_s"] > 0
    assert tpt["case"] == "CoCoOp+TPT" and "adapts at test time" in tpt["refused"]
    rehearsed = {"CoCoOp", "CoOp", "DeAR", "RAda", "RAda (images)", "TPT", "CoCoOp+TPT", "MaPLe+TPT"}
    # CPU against CPU: the same weights, values and batch give the same outputs
    assert {record["case"] for record in report["parity"]} == rehearsed
    assert all(record["passed"] and record["logits"] == 0.0 for record in report["parity"])
    trained = {record["case"]: record for record in report["trainers"]}
    assert set(trained) == rehearsed and not [name for name, r in trained.items() if "error" in r]
    assert report["trainers"][0]["case"] == "CoCoOp"  # first: it was the case left unmeasured
    assert trained["DeAR"]["train"]["images_per_s"] > 0 and trained["TPT"]["train"] is None
    assert trained["DeAR"]["flops"]["train"] > trained["DeAR"]["flops"]["frozen"] > 0  # the FLOP fraction
    assert {test["outcome"] for test in report["cuda_tests"]} == {"skipped"}  # no CUDA here
    tree, passes, runs = report["data"]["tree"], report["data"]["passes"], report["data"]["runs"]
    assert tree["images"] == 4 * (16 + 2) and tree["size"] == [64, 48]
    # 2 base classes x 16 shots at batch 8, then the test on 2 x 2 base images, then on 2 x 2 new ones
    assert [(p["run"], p["train"], p["batches"], p["images"]) for p in passes] == [
        ("train_base", True, 4, 32), ("train_base", False, 1, 4), ("test_new", False, 1, 4)]
    assert 0 <= passes[0]["wait_share"] < 1 and passes[0]["workers"] == 1
    assert [(r["run"], r["exit_status"], r["images"]) for r in runs] == [("train_base", 0, 36), ("test_new", 0, 4)]
    verdicts = {check["check"]: check["passed"] for check in report["checks"]}
    assert verdicts["CUDA-only tests pass"] is True  # they skip without CUDA: pytest exits 0
    assert verdicts["TAC's CUDA test passes"] is None
    assert verdicts["every case trains and evaluates at the papers' settings"] is True
    assert verdicts["CoCoOp evaluates 4 classes at evaluation batch 4"] is True
    assert verdicts["the DeAR base-to-novel chain runs from the JPEG tree (train, test base, test new)"] is True
    assert verdicts["DeAR trains at least 1500 images/s (batch 16, AMP)"] is None  # a GPU target
    markdown = (out / "acceptance.md").read_text()
    assert markdown.startswith("# GPU acceptance: CPU rehearsal")
    for section in ("## CUDA-only tests", "## CUDA against CPU", "## Ours against the official code",
                    "## Every case at the papers' settings", "## Distance to the limit", "## Eager against compiled",
                    "## Real-size data"):
        assert section in markdown
    assert "===== parity.log" in (out / "logs.txt").read_text()


def test_a_stage_past_its_limit_is_stopped_with_what_it_started(tmp_path):
    child = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(30)']); open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
              "time.sleep(30)")
    outcome = run.Stage("slow", [sys.executable, "-c", script], str(tmp_path), seconds=3).wait()
    assert outcome["stopped"] and outcome["exit_status"] is None and outcome["seconds"] < 20
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the stage's child outlived the stage"
        time.sleep(0.05)
    quick = run.Stage("quick", [sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path), seconds=20).wait()
    assert not quick["stopped"] and quick["exit_status"] == 3 and quick["cpu_s"] >= 0


PROBE_MODULE = """import os, subprocess, sys, time
print("ran", __name__, sys.argv[1:], os.getcwd(), os.environ["OMP_NUM_THREADS"], torch.get_num_threads())
if sys.argv[1] == "exit":
    raise SystemExit(3)
if sys.argv[1] == "fail":
    raise RuntimeError("boom")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
open(sys.argv[2], "w").write(str(child.pid))
time.sleep(30)
"""


def _forked_stages(argv, kill):
    """Process target (forked from tests/forked_runs.py's forkserver, which imported torch as the
    rehearsal's run process does; no other thread runs): the probe module as three forked stages;
    their outcomes and logs as JSON into ``argv[0]``."""
    folder = os.path.dirname(argv[0])
    outcomes = {}
    for kind, seconds in (("exit", 20), ("fail", 20), ("sleep", 2)):
        command = [sys.executable, "-m", "stage_probe", kind, os.path.join(folder, "child.pid")]
        outcome = run.Stage(kind, command, folder, seconds, threads=1, forked=True).wait()
        outcomes[kind] = dict(outcome, log=open(os.path.join(folder, "logs", f"{kind}.log")).read())
    with open(argv[0], "w") as f:
        json.dump(outcomes, f)


def test_a_forked_stage_runs_its_module_and_is_stopped_with_what_it_started(tmp_path, monkeypatch):
    """The rehearsal's stages (run.ForkedCommand): the module runs as ``__main__`` with its arguments,
    from the repository root, with the stage's threads, its output in the stage's log and its exit
    status the module's (1 with the traceback for an exception); past its limit it is stopped with
    the processes it started."""
    (tmp_path / "stage_probe.py").write_text("import torch\n" + PROBE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the forked processes import the probe from here
    status, _ = launch(forkserver_context(), _forked_stages, [str(tmp_path / "outcomes.json")])
    assert status == 0
    outcomes = json.loads((tmp_path / "outcomes.json").read_text())
    ran = f"ran __main__ ['exit', '{tmp_path / 'child.pid'}'] {ROOT} 1 1"
    assert outcomes["exit"]["exit_status"] == 3 and not outcomes["exit"]["stopped"] and ran in outcomes["exit"]["log"]
    assert outcomes["fail"]["exit_status"] == 1 and "Traceback" in outcomes["fail"]["log"]
    assert outcomes["fail"]["log"].rstrip().endswith("RuntimeError: boom")
    assert outcomes["sleep"]["stopped"] and outcomes["sleep"]["exit_status"] is None
    assert all(outcome["cpu_s"] >= 0 for outcome in outcomes.values())
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the stage's child outlived the stage"
        time.sleep(0.05)


def test_the_last_step_that_runs_takes_the_rest_of_the_budget(tmp_path, monkeypatch):
    """Each step ends by its cumulative deadline; stages that cannot run are skipped with the reason, and
    data needs its tree."""
    started = []

    class Recorded:
        def __init__(self, name, command, out_dir, seconds, threads=0, forked=False):
            assert forked  # the rehearsal forks its stages
            started.append((name, round(seconds)))
            if name == "data-tree":
                (tmp_path / "data_tree.json").write_text("{}")
            self.name = name

        def wait(self):
            return {"stage": self.name, "exit_status": 0, "stopped": False, "seconds": 0.0, "cpu_s": 0.0}

    monkeypatch.setattr(run, "Stage", Recorded)
    monkeypatch.setattr(run, "_gather_logs", lambda out_dir: None)
    monkeypatch.setattr(run, "preload_rehearsal", lambda: started.append(("preload", 0)))  # its time is not the stages'
    report = run.run(str(tmp_path), official=str(tmp_path / "none"), rehearsal=True, budget_s=100,
                     stages=["data", "trainers"])
    assert started == [("preload", 0), ("environment", 5), ("data-tree", 25), ("data", 40), ("trainers", 100)]
    skipped = {stage["stage"]: stage.get("skipped") for stage in report["stages"]}
    assert skipped["official"] == skipped["parity"] == "not selected (--stages)"
    started.clear()
    run.run(str(tmp_path), official=str(tmp_path / "none"), rehearsal=True, budget_s=100, stages=["trainers", "data"])
    assert [name for name, _ in started] == ["preload", "environment", "data-tree", "data", "trainers"]


def _report(**changes):
    report = {"stages": [{"stage": "cuda-tests", "exit_status": 0, "summary": "4 passed"},
                         {"stage": "trainers", "exit_status": 0, "stopped": False}],
              "cuda_tests": [{"test": "tests/test_cuda.py::test_amp_steps[TAC]", "outcome": "passed"}],
              "parity": [{"case": "CoOp", "passed": True}], "trainers": [],
              "official": {"results": [{"case": "CoOp", "ours_over_official_train_ms": 0.4, "ours_peak_mib": 300.0,
                                        "official_peak_mib": 900.0, "ours_over_official_peak": 1 / 3}]},
              "compiled": [], "data": {}, "settings": {"classes": 1000, "eval_batch": 250},
              "environment": {"gpu": "NVIDIA H100"}, "seconds": 100.0}
    report.update(changes)
    return {name: passed for name, passed, _ in checks(report)}


def _measured(case, trainer, train_ms=None, images_per_s=100.0):
    train = None if train_ms is None else {"wall_ms": train_ms, "images_per_s": images_per_s}
    return {"case": case, "trainer": trainer, "train": train, "eval": {"images_per_s": 50.0}, "peak_memory_mib": 1.0}


def test_checks_fail_on_what_the_run_found():
    assert all(_report().get(name) is not False for name in _report())
    assert _report()["TAC's CUDA test passes"] is True
    assert _report(cuda_tests=[{"test": "tests/test_cuda.py::test_amp_steps[TAC]", "outcome": "failed"}])[
        "TAC's CUDA test passes"] is False
    assert _report(parity=[{"case": "CoOp", "passed": True}, {"case": "TAC", "passed": False}])[
        "CUDA and CPU agree on the tiny CLIP (every case)"] is False
    assert _report(trainers=[{"case": "DeAR", "trainer": "DeAR", "error": ["boom"]}])[
        "every case trains and evaluates at the papers' settings"] is False
    stopped = [{"case": "CoCoOp", "trainer": "CoCoOp", "error": ["stopped at its limit of 60 s"], "stopped": True}]
    assert _report(trainers=stopped)["CoCoOp evaluates 1000 classes at evaluation batch 250"] is False
    assert _report(trainers=[_measured("CoCoOp", "CoCoOp", 30.0)])[
        "CoCoOp evaluates 1000 classes at evaluation batch 250"] is True
    slow_dear = [_measured("DeAR", "DeAR", 20.0, images_per_s=800.0)]
    assert _report(trainers=slow_dear)["DeAR trains at least 1500 images/s (batch 16, AMP)"] is False
    fast_compiled = [{"case": "DeAR", "eager": slow_dear[0], "compiled": _measured("DeAR", "DeAR", 8.0, 2000.0)}]
    verdicts = _report(trainers=slow_dear, compiled=fast_compiled + [{"case": "TPT", "trainer": "TPT", "refused": "x"}])
    assert verdicts["DeAR trains at least 1500 images/s (batch 16, AMP)"] is True  # the compiled step counts
    assert verdicts["a compiled training step at least 2x as fast as the eager one (every case measured)"] is True
    slow_compiled = [{"case": "DeAR", "eager": slow_dear[0], "compiled": _measured("DeAR", "DeAR", 12.0)}]
    assert _report(compiled=slow_compiled)[
        "a compiled training step at least 2x as fast as the eager one (every case measured)"] is False
    costly = {"results": [{"case": "MaPLe", "ours_over_official_train_ms": 0.7}]}
    assert _report(official=costly)["our step at most 0.5 of the official step (train ms)"] is False
    heavy = {"results": [{"case": "MaPLe", "ours_over_official_train_ms": 0.4, "ours_peak_mib": 600.0,
                          "official_peak_mib": 900.0, "ours_over_official_peak": 2 / 3}]}
    assert _report(official=heavy)["our peak memory at most 0.5 of the official one (CUDA max allocated)"] is False
    assert _report(official=heavy, environment={})[
        "our peak memory at most 0.5 of the official one (CUDA max allocated)"] is None  # a GPU target
    waiting = {"passes": [{"pass": 1, "train": True, "wait_share": 0.25, "finished": False, "batches": 100}],
               "runs": [{"run": "train_base", "exit_status": 0}], "chain": None}
    verdicts = _report(data=waiting)
    assert verdicts["the training step waits for its batch under 10 % of the step"] is False
    assert verdicts["the DeAR base-to-novel chain runs from the JPEG tree (train, test base, test new)"] is False
    failed = {"passes": [], "runs": [{"run": "train_base", "exit_status": 1}], "chain": {"exit_status": 1}}
    assert _report(data=failed)[
        "the DeAR base-to-novel chain runs from the JPEG tree (train, test base, test new)"] is False
    stopped = [{"stage": "trainers", "exit_status": None, "stopped": True}]
    assert _report(stages=stopped)["every stage finished within its time"] is False
    assert _report(stages=[{"stage": "cuda-tests", "exit_status": 1}])["CUDA-only tests pass"] is False


def test_official_trees_plan_and_command(tmp_path):
    for name in ("KaiyangZhou+CoOp", "yunncheng+MMRL", "dassl"):
        (tmp_path / name).mkdir()
    given, dassl = run.official_trees(str(tmp_path))
    assert given == [f"KaiyangZhou/CoOp={tmp_path / 'KaiyangZhou+CoOp'}", f"yunncheng/MMRL={tmp_path / 'yunncheng+MMRL'}"]
    assert dassl == str(tmp_path / "dassl")
    assert run.official_trees(str(tmp_path / "absent")) == ([], None)
    assert run.official_methods() == ["CoOp", "MaPLe", "MMRL", "PromptSRC"]  # declared by their cost specs
    measured, unavailable = run.official_plan(run.GPU_SETTINGS, given, dassl)
    assert measured == ["CoOp", "MMRL"]
    assert unavailable == {"MaPLe": "official code not available: no exported tree of Koorye/DePT",
                           "PromptSRC": "official code not available: no exported tree of muzairkhattak/PromptSRC"}
    assert run.official_plan(run.GPU_SETTINGS, given, None)[1]["CoOp"] == (
        "official code not available: no exported Dassl.pytorch")
    gpu = run.official_argv(run.GPU_SETTINGS, measured, given, dassl)
    assert gpu[gpu.index("--methods") + 1:gpu.index("--device")] == measured
    assert gpu[gpu.index("--device") + 1] == "cuda" and gpu[gpu.index("--prec") + 1] == "recipe"
    assert gpu[gpu.index("--batch") + 1] == "0" and gpu[gpu.index("--classes") + 1] == "1000"  # the recipes' batches
    assert gpu[gpu.index("--side-limit") + 1] == "45"
    assert gpu[-2:] == ["--dassl-git", dassl] and gpu.count("--official-git") == 2
    every = [f"{name}=x" for name in ("KaiyangZhou/CoOp", "Koorye/DePT", "yunncheng/MMRL", "muzairkhattak/PromptSRC")]
    on_cpu, refused = run.official_plan(run.REHEARSAL_SETTINGS, every, dassl)
    assert "PromptSRC" not in on_cpu and "recipe's precision" in refused["PromptSRC"]
    rehearsal = run.official_argv(run.REHEARSAL_SETTINGS, on_cpu, every, dassl)
    assert rehearsal[rehearsal.index("--prec") + 1] == "fp32" and rehearsal[rehearsal.index("--batch") + 1] == "2"


def test_a_stopped_official_stage_reports_the_methods_it_measured(tmp_path):
    _official = acceptance_report._official

    assert _official(str(tmp_path)) is None
    measured = {"case": "CoOp", "official_code": "KaiyangZhou/CoOp@ff61507c", "ours_over_official_train_ms": 0.3}
    (tmp_path / "official.jsonl").write_text(json.dumps(measured) + "\n")
    assert _official(str(tmp_path)) == {"settings": None, "results": [measured]}
    (tmp_path / "official.json").write_text(json.dumps({"settings": {"batch": 16}, "results": []}))
    assert _official(str(tmp_path))["settings"] == {"batch": 16}


def test_prepared_trees_carry_their_commit_and_export_again_without_git(tmp_path):
    repository = tmp_path / "official"
    repository.mkdir()
    (repository / "trainer.py").write_text("VALUE = 1\n")
    git = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    folder = tmp_path / "carried"
    assert prepare.export_official(str(folder), [f"owner/name={repository}"], None) == {"owner/name": commit}
    exported = folder / "owner+name"
    assert (exported / EXPORTED_COMMIT_FILE).read_text().strip() == commit
    assert export(str(exported), str(tmp_path / "again")) == commit  # a tree exported earlier: copied
    assert (tmp_path / "again" / "trainer.py").read_text() == "VALUE = 1\n"
    with pytest.raises(SystemExit, match="OWNER/NAME=PATH"):
        prepare.export_official(str(folder), [str(repository)], None)


def test_official_benchmark_refuses_what_cannot_run(monkeypatch):
    parser = __import__("argparse").ArgumentParser()
    cost.add_arguments(parser)
    parser.add_argument("--clock", default="wall")
    args = parser.parse_args(["--methods", "PromptSRC", "--official-git", "muzairkhattak/PromptSRC=x",
                              "--dassl-git", "y"])
    with pytest.raises(SystemExit, match="runs only in its recipe's precision"):
        cost.measure(args)
    if not torch.cuda.is_available():
        args = parser.parse_args(["--methods", "CoOp", "--official-git", "KaiyangZhou/CoOp=x", "--dassl-git", "y",
                                  "--device", "cuda"])
        with pytest.raises(SystemExit, match="CUDA is not available"):
            cost.measure(args)


def test_the_official_stage_writes_each_method_as_it_is_measured(tmp_path, monkeypatch):
    seen = []

    def measure(args, on_record=None):
        seen.append((args.methods, args.device, args.prec))
        records = [{"case": "CoOp", "ours_over_official_train_ms": 0.3}, {"case": "MMRL", "error": "boom"}]
        for record in records:
            on_record(record)
            assert (tmp_path / "official.jsonl").read_text().count("\n") == records.index(record) + 1
        return {"batch": 16}, records

    monkeypatch.setattr(cost, "measure", measure)
    argv = run.official_argv(run.GPU_SETTINGS, run.official_methods(), ["KaiyangZhou/CoOp=x"], "d")
    stages.official(str(tmp_path), {"official_argv": argv})
    assert seen == [(run.official_methods(), "cuda", "recipe")]
    report = json.loads((tmp_path / "official.json").read_text())
    assert report["benchmark"] == "official" and [r["case"] for r in report["results"]] == ["CoOp", "MMRL"]


def test_a_loader_pass_splits_each_step_into_its_wait_and_the_rest():
    # batches arrive at 1.0 (after a 1.0 s first wait), 1.5 and 2.5 (after waits of 0.1 and 0.4); the
    # pass ends at 3.0: steps of 0.5, 1.0 and 0.5 s, their waits 0.1, 0.4 and none
    summary = data.pass_summary([1.0, 0.1, 0.4], [1.0, 1.5, 2.5, 3.0], images=24, finished=True)
    assert summary["batches"] == 3 and summary["seconds"] == 3.0 and summary["images_per_s"] == 8.0
    assert summary["first_wait_s"] == 1.0 and summary["wait_s"] == pytest.approx(0.5)
    assert summary["wait_share"] == pytest.approx(0.5 / 2.0)
    assert summary["step_share_median"] == pytest.approx(0.3) and summary["step_share_max"] == pytest.approx(0.4)
    # stopped after the third batch arrived: the third step's end is unknown
    partial = data.pass_summary([1.0, 0.1, 0.4], [1.0, 1.5, 2.5], images=24, finished=False)
    assert partial["wait_share"] == pytest.approx(0.5 / 1.5) and partial["seconds"] == 2.5
    assert data.pass_summary([1.0], [1.0, 1.2], images=8, finished=True)["wait_share"] is None


class _Items(torch.utils.data.Dataset):
    is_train = True

    def __len__(self):
        return 6

    def __getitem__(self, index):
        time.sleep(0.01)
        return {"img": torch.zeros(1), "label": index}


def test_loader_waits_times_every_next_of_a_real_loader():
    records = []
    loader = torch.utils.data.DataLoader(_Items(), batch_size=2)
    with data.LoaderWaits(records.append).active():
        for _ in loader:
            time.sleep(0.02)  # the step's work
        next(iter(loader))  # a second pass, left before its end: no record
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__.__name__ == "__next__"  # restored
    record, = records
    assert record["train"] and record["batches"] == 3 and record["images"] == 6 and record["finished"]
    assert record["workers"] == 0 and record["first_wait_s"] >= 0.02 and record["wait_s"] >= 0.04
    assert 0.2 < record["wait_share"] < 0.8  # 2 x 20 ms of loading against 3 x 20 ms of work and that loading


def test_data_records_keep_the_last_line_of_each_pass(tmp_path):
    lines = [{"kind": "pass", "pass": 1, "run": "train_base", "batches": 100, "finished": False},
             {"kind": "pass", "pass": 1, "run": "train_base", "batches": 500, "finished": True},
             {"kind": "pass", "pass": 2, "run": "train_base", "batches": 12, "finished": True},
             {"kind": "run", "run": "train_base", "exit_status": 0, "seconds": 30.0, "images": 11000}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = acceptance_report.data_records(str(tmp_path))
    assert [(p["pass"], p["batches"]) for p in found["passes"]] == [(1, 500), (2, 12)]
    assert found["runs"] == lines[3:] and found["chain"] is None and found["tree"] is None


def test_cuda_tests_are_read_from_the_junit_file(tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_cuda" name="test_amp[TAC]"><failure message="bad"/>'
        '</testcase><testcase classname="tests.test_cuda" name="test_amp[CoOp]"/><testcase classname="tests.'
        'test_engine" name="test_scaler"><skipped message="needs CUDA"/></testcase></testsuite></testsuites>')
    assert acceptance_report.cuda_tests(str(tmp_path / "tests.xml")) == [
        {"test": "tests/test_cuda.py::test_amp[TAC]", "outcome": "failed", "message": "bad"},
        {"test": "tests/test_cuda.py::test_amp[CoOp]", "outcome": "passed", "message": ""},
        {"test": "tests/test_engine.py::test_scaler", "outcome": "skipped", "message": "needs CUDA"}]
    assert acceptance_report.cuda_tests(str(tmp_path / "absent.xml")) == []


def test_a_case_past_its_limit_becomes_a_stopped_record(monkeypatch):
    from vlprompt_app.benchmarking import per_trainer
    from vlprompt_app.benchmarking.trainer_cases import case_named

    monkeypatch.setattr(per_trainer, "measure_case", lambda case, settings: time.sleep(5))
    start = time.monotonic()
    record = stages.measured(case_named("CoOp"), {"case_limit_s": 0.2, "device": "cpu"})
    assert time.monotonic() - start < 3
    assert record == {"case": "CoOp", "trainer": "CoOp", "error": ["stopped at its limit of 0.2 s"], "stopped": True}


def test_the_compiled_stage_measures_each_case_with_the_benchmarks_compile_option(tmp_path, monkeypatch):
    """Each case is measured once with the settings' backend (eager and compiled calls in the same
    rounds); its record splits into the two sides, an error kept as such; a trainer whose class refuses
    TRAIN.COMPILE is recorded with its reason and not built."""
    from vlprompt_app.benchmarking import per_trainer

    seen = []

    def measure_case(case, settings):
        seen.append((case.name, settings["compile"], settings["flops"]))
        if case.name == "CLIPAdapter":
            raise RuntimeError("boom")
        return {"case": case.name, "trainer": case.trainer, "rounds": {}, "train": {"images": 2},
                "eval": {"images": 4}, "compile": {"backend": "eager", "compile_s": 1.5, "graphs": 2, "graph_breaks": 0,
                                                   "train": {"eager_ms": 10.0, "compiled_ms": 4.0},
                                                   "eval": {"eager_ms": 8.0, "compiled_ms": 2.0}}}

    monkeypatch.setattr(per_trainer, "measure_case", measure_case)
    monkeypatch.setattr(per_trainer, "progress_line", lambda record: record["case"])
    stages.compiled(str(tmp_path), dict(run.REHEARSAL_SETTINGS, compile_cases=["CoCoOp+TPT", "CoOp", "CLIPAdapter"]))
    assert seen == [("CoOp", "eager", False), ("CLIPAdapter", "eager", False)]  # CoCoOp+TPT's class refuses: not built
    coop, rada, tpt = [json.loads(line) for line in (tmp_path / "compiled.jsonl").read_text().splitlines()]
    assert coop["eager"] == {"train": {"wall_ms": 10.0, "images_per_s": 200.0}, "eval": {"wall_ms": 8.0,
                                                                                          "images_per_s": 500.0}}
    assert coop["compiled"] == {"train": {"wall_ms": 4.0, "images_per_s": 500.0}, "eval": {"wall_ms": 2.0,
                                                                                            "images_per_s": 2000.0}}
    assert (coop["compile_s"], coop["graphs"], coop["graph_breaks"]) == (1.5, 2, 0)
    assert tpt["case"] == "CoCoOp+TPT" and tpt["refused"].startswith("it adapts at test time")
    assert rada["eager"]["error"][-1] == rada["compiled"]["error"][-1] == "RuntimeError: boom"
    rows = acceptance_report.compiled_rows([coop, tpt, rada])
    assert rows[0] == ["CoOp", "10.0", "4.0", "2.50", "8.0", "2.0", "4.00", "1.5", "2", "0"]
    assert rows[1][:2] == ["CoCoOp+TPT", "refuses: " + tpt["refused"]] and rows[2][:2] == ["CLIPAdapter", "RuntimeError: boom"]


def test_the_imagenet_tree_is_drawn_alike_by_any_number_of_writers_and_reused(tmp_path):
    from vlprompt_app.benchmarking.photos import write_imagenet_tree

    one = write_imagenet_tree(str(tmp_path / "one"), 3, 2, 1, (40, 30), processes=1)
    two = write_imagenet_tree(str(tmp_path / "two"), 3, 2, 1, (40, 30), processes=2)
    assert one["images"] == two["images"] == 9 and not one["reused"]
    base = tmp_path / "one" / "imagenet"
    assert (base / "classnames.txt").read_text().splitlines()[2] == "n00000002 class number 2"
    assert sorted(os.listdir(base / "images" / "val" / "n00000001")) == ["n00000001_00000.JPEG"]
    for relative in ("images/train/n00000002/n00000002_00001.JPEG", "images/val/n00000000/n00000000_00000.JPEG"):
        assert (base / relative).read_bytes() == (tmp_path / "two" / "imagenet" / relative).read_bytes()
    assert write_imagenet_tree(str(tmp_path / "one"), 3, 2, 1, (40, 30))["reused"]
    assert not write_imagenet_tree(str(tmp_path / "one"), 3, 3, 1, (40, 30), processes=1)["reused"]  # another shape
