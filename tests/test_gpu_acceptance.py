"""tools/gpu_acceptance.py: the CPU rehearsal of the GPU acceptance run (every stage, tiny
settings), the stage time limits, the report's checks, the carried folder and the official
benchmark's device and precision options."""
import json
import os
import subprocess
import sys

import pytest
import torch

from vlprompt_app.fidelity import cost
from vlprompt_app.fidelity.export import EXPORTED_COMMIT_FILE, export
from vlprompt_app.gpu_acceptance import prepare, run
from vlprompt_app.gpu_acceptance.report import checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.e2e
def test_rehearsal_runs_every_stage_and_reports(tmp_path):
    out = tmp_path / "acceptance"
    done = subprocess.run([sys.executable, "tools/gpu_acceptance.py", "run", "--rehearsal", "--out", str(out),
                           "--official", str(tmp_path / "no_trees")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == ["acceptance.json", "acceptance.md", "environment.json", "logs.txt",
                                       "parity.jsonl", "trainers.jsonl"]
    report = json.loads((out / "acceptance.json").read_text())
    stages = {stage["stage"]: stage for stage in report["stages"]}
    assert [stage["stage"] for stage in report["stages"]] == ["environment", "cuda-tests", "parity", "official",
                                                              "trainers"]
    assert all(stages[name]["exit_status"] == 0 for name in ("environment", "cuda-tests", "parity", "trainers"))
    assert "no exported official trees" in stages["official"]["skipped"]
    rehearsed = {"CoOp", "DeAR", "RAda", "RAda (images)", "TPT", "CoCoOp+TPT", "MaPLe+TPT"}
    # CPU against CPU: the same weights, values and batch give the same outputs
    assert {record["case"] for record in report["parity"]} == rehearsed
    assert all(record["passed"] and record["logits"] == 0.0 for record in report["parity"])
    trained = {record["case"]: record for record in report["trainers"]}
    assert set(trained) == rehearsed and not [name for name, r in trained.items() if "error" in r]
    assert trained["DeAR"]["train"]["images_per_s"] > 0 and trained["TPT"]["train"] is None
    verdicts = {check["check"]: check["passed"] for check in report["checks"]}
    assert verdicts["CUDA-only tests pass"] is True  # they skip without CUDA: pytest exits 0
    assert verdicts["every case trains and evaluates at the papers' settings"] is True
    assert verdicts["DeAR trains at least 400 images/s (batch 16, AMP)"] is None  # a GPU target
    markdown = (out / "acceptance.md").read_text()
    assert markdown.startswith("# GPU acceptance: CPU rehearsal")
    assert "## CUDA against CPU" in markdown and "## Every case at the papers' settings" in markdown
    assert "===== parity.log" in (out / "logs.txt").read_text()


def test_a_stage_past_its_limit_is_stopped(tmp_path):
    stage = run.Stage("slow", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                      str(tmp_path), seconds=2)
    outcome = stage.wait()
    assert outcome["stopped"] and outcome["exit_status"] is None and outcome["seconds"] < 20
    quick = run.Stage("quick", [sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path), seconds=20).wait()
    assert not quick["stopped"] and quick["exit_status"] == 3


def _report(**changes):
    report = {"stages": [{"stage": "cuda-tests", "exit_status": 0, "summary": "4 passed"},
                         {"stage": "trainers", "exit_status": 0, "stopped": False}],
              "parity": [{"case": "CoOp", "passed": True}], "trainers": [],
              "official": {"results": [{"case": "CoOp", "ours_over_official_train_ms": 0.4}]},
              "environment": {"gpu": "NVIDIA H100"}, "seconds": 100.0}
    report.update(changes)
    return {name: passed for name, passed, _ in checks(report)}


def test_checks_fail_on_what_the_run_found():
    assert all(_report().get(name) is not False for name in _report())
    assert _report(parity=[{"case": "CoOp", "passed": True}, {"case": "TAC", "passed": False}])[
        "CUDA and CPU agree on the tiny CLIP (every case)"] is False
    assert _report(trainers=[{"case": "DeAR", "error": ["boom"]}])[
        "every case trains and evaluates at the papers' settings"] is False
    slow_dear = [{"case": "DeAR", "train": {"images_per_s": 350.0}}]
    assert _report(trainers=slow_dear)["DeAR trains at least 400 images/s (batch 16, AMP)"] is False
    costly = {"results": [{"case": "MaPLe", "ours_over_official_train_ms": 0.7}]}
    assert _report(official=costly)["our step at most 0.5 of the official step (train ms)"] is False
    stopped = [{"stage": "trainers", "exit_status": None, "stopped": True}]
    assert _report(stages=stopped)["every stage finished within its time"] is False
    assert _report(stages=[{"stage": "cuda-tests", "exit_status": 1}])["CUDA-only tests pass"] is False


def test_official_trees_and_command(tmp_path):
    for name in ("KaiyangZhou+CoOp", "yunncheng+MMRL", "dassl"):
        (tmp_path / name).mkdir()
    given, dassl = run.official_trees(str(tmp_path))
    assert given == [f"KaiyangZhou/CoOp={tmp_path / 'KaiyangZhou+CoOp'}", f"yunncheng/MMRL={tmp_path / 'yunncheng+MMRL'}"]
    assert dassl == str(tmp_path / "dassl")
    assert run.official_trees(str(tmp_path / "absent")) == ([], None)
    gpu = run.official_argv(run.GPU_SETTINGS, given, dassl)
    assert run.official_methods() == ["CoOp", "MaPLe", "MMRL", "PromptSRC"]  # declared by their cost specs
    assert gpu[gpu.index("--methods") + 1:gpu.index("--device")] == run.official_methods()
    assert gpu[gpu.index("--device") + 1] == "cuda" and gpu[gpu.index("--prec") + 1] == "recipe"
    assert gpu[-2:] == ["--dassl-git", dassl] and gpu.count("--official-git") == 2
    rehearsal = run.official_argv(run.REHEARSAL_SETTINGS, given, dassl)
    assert "PromptSRC" not in rehearsal and rehearsal[rehearsal.index("--prec") + 1] == "fp32"


def test_a_stopped_official_stage_reports_the_methods_it_measured(tmp_path):
    from vlprompt_app.gpu_acceptance.report import _official

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
    from vlprompt_app.gpu_acceptance import stages

    seen = []

    def measure(args, on_record=None):
        seen.append((args.methods, args.device, args.prec))
        records = [{"case": "CoOp", "ours_over_official_train_ms": 0.3}, {"case": "MMRL", "error": "boom"}]
        for record in records:
            on_record(record)
            assert (tmp_path / "official.jsonl").read_text().count("\n") == records.index(record) + 1
        return {"batch": 16}, records

    monkeypatch.setattr(cost, "measure", measure)
    argv = run.official_argv(run.GPU_SETTINGS, ["KaiyangZhou/CoOp=x"], "d")
    stages.official(str(tmp_path), {"official_argv": argv})
    assert seen == [(run.official_methods(), "cuda", "recipe")]
    report = json.loads((tmp_path / "official.json").read_text())
    assert report["benchmark"] == "official" and [r["case"] for r in report["results"]] == ["CoOp", "MMRL"]
