"""Tests of tools/parse_results.py on run folders built in tmp_path with Dassl-style logs."""
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest
from forked_runs import run_script

TOOLS_DIR = Path(__file__).resolve().parents[1] / "tools"
from vlprompt_app import results as pr
from vlprompt_app.commands import parse_results

SCRIPT = TOOLS_DIR / "parse_results.py"

HEADER = """\
***************
** Arguments **
***************
config_file: configs/trainers/CoOp/vit_b16_ep50.yaml
dataset_config_file: configs/datasets/dtd.yaml
seed: 1
Collecting env info ...
** System info **
PyTorch version: 2.4.0
Loading trainer: CoOp
Loading dataset: DescribableTextures
Reading split from /data/dtd/split_zhou_DescribableTextures.json
Building transform_train
+ random resized crop (size=(224, 224), scale=(0.08, 1.0))
Loading evaluator: Classification
No checkpoint found, train from scratch
Initialize tensorboard (log_dir=output/dtd/tensorboard)
epoch [1/2] batch [5/5] time 0.101 (0.250) data 0.000 (0.080) loss 2.1719 (2.5234) acc 40.6250 (31.2500) lr 2.0000e-03 eta 0:00:01
epoch [2/2] batch [5/5] time 0.099 (0.180) data 0.000 (0.040) loss 1.2031 (1.4844) acc 65.6250 (59.3750) lr 1.0000e-03 eta 0:00:00
"""


def result_block(acc, decimals=1, macro_f1=80.5):
    return (f"=> result\n* total: 1,692\n* correct: 1,371\n* accuracy: {acc:.{decimals}f}%\n"
            f"* error: {100 - acc:.{decimals}f}%\n* macro_f1: {macro_f1:.{decimals}f}%\n")


def train_log(acc, decimals=1, signal="Finish training", val_acc=None):
    """A training log; ``val_acc`` adds an evaluation block before the end signal."""
    before = ("Evaluate on the *val* set\n" + result_block(val_acc)) if val_acc is not None else ""
    return (HEADER + before + "Checkpoint saved to output/dtd/prompt_learner/model.pth.tar-2\n"
            + f"{signal}\nDeploy the last-epoch model\nEvaluate on the *test* set\n"
            + result_block(acc, decimals) + "Elapsed: 0:01:02\n")


def eval_only_log(acc):
    return (HEADER.split("Initialize tensorboard")[0]
            + "Loading weights to prompt_learner from "
              '"output/base2new/train_base/dtd/shots_16/CoOp/cfg/seed1/prompt_learner/'
              'model.pth.tar-2" (epoch = 2)\n'
            + "Evaluate on the *test* set\n" + result_block(acc))


CRASHED_LOG = HEADER  # training started, the process died before "Finish training"


def write(path: Path, text: str, mtime: float = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def run_cli(*args):
    """``python tools/parse_results.py ARGS`` (run as tests/forked_runs.py runs a script)."""
    return run_script([sys.executable, str(SCRIPT), *map(str, args)], timeout=60)


# ----------------------------------------------------------------------- parse_log


def test_parse_log_counts_only_results_after_the_end_signal(tmp_path):
    log = write(tmp_path / "log.txt", train_log(81.0, val_acc=50.0))
    assert pr.parse_log(log) == 81.0
    before_only = write(tmp_path / "b.txt", HEADER + result_block(50.0) + "Finish training\n")
    assert pr.parse_log(before_only) is None


def test_parse_log_last_match_wins_with_test_signal(tmp_path):
    log = write(tmp_path / "log.txt", train_log(81.0, val_acc=50.0))
    assert pr.parse_log(log, end_signals=pr.TEST_END_SIGNALS) == 81.0
    two_blocks = write(tmp_path / "t.txt", eval_only_log(60.0) + result_block(62.5))
    assert pr.parse_log(two_blocks, end_signals=pr.TEST_END_SIGNALS) == 62.5


def test_parse_log_old_wording_and_two_decimals(tmp_path):
    log = write(tmp_path / "log.txt", train_log(72.43, decimals=2, signal="Finished training"))
    assert pr.parse_log(log) == 72.43
    assert pr.parse_log(log, end_signals=("Finish training",)) is None


def test_parse_log_keyword_is_escaped(tmp_path):
    log = write(tmp_path / "log.txt", train_log(81.0))
    assert pr.parse_log(log, keyword="macro_f1") == 80.5
    assert pr.parse_log(log, keyword="error") == 19.0
    assert pr.parse_log(log, keyword="accura.y") is None


def test_eval_only_log_needs_the_test_signal(tmp_path):
    log = write(tmp_path / "log.txt", eval_only_log(76.3))
    assert pr.parse_log(log) is None
    assert pr.parse_log(log, end_signals=pr.TEST_END_SIGNALS) == 76.3


# ------------------------------------------------------------------ run folders


def test_find_runs_skips_hidden_and_does_not_descend_into_runs(tmp_path):
    write(tmp_path / "exp" / "seed1" / "log.txt", train_log(80.0))
    write(tmp_path / "exp" / "seed1" / "prompt_learner" / "log.txt", "stray")
    write(tmp_path / "exp" / "seed2" / "results.json", "{}")
    write(tmp_path / ".trash" / "seed3" / "log.txt", train_log(10.0))
    (tmp_path / "exp" / "empty").mkdir()
    runs = pr.find_runs(tmp_path)
    assert [r.path.relative_to(tmp_path).as_posix() for r in runs] == ["exp/seed1", "exp/seed2"]
    assert runs[1].logs == () and runs[1].results_json.name == "results.json"


def test_newest_log_is_chosen_by_timestamp_in_name(tmp_path):
    run_dir = tmp_path / "seed1"
    # mtimes deliberately contradict the names: the name decides
    write(run_dir / "log.txt", CRASHED_LOG, mtime=3_000_000_000)
    write(run_dir / "log.txt-2024-03-05-14-07-09", train_log(81.0), mtime=1_000_000_000)
    write(run_dir / "log.txt-2023-12-31-23-59-59", train_log(70.0), mtime=2_000_000_000)
    run, = pr.find_runs(tmp_path)
    assert [p.name for p in run.logs] == [
        "log.txt", "log.txt-2023-12-31-23-59-59", "log.txt-2024-03-05-14-07-09"]
    result = pr.read_run(run)
    assert result.value == 81.0
    assert result.source.name == "log.txt-2024-03-05-14-07-09"
    assert len(result.notes) == 1
    assert "holds 3 logs" in result.notes[0]
    assert "using the newest, log.txt-2024-03-05-14-07-09" in result.notes[0]


def test_newer_crashed_rerun_makes_the_run_incomplete(tmp_path):
    write(tmp_path / "seed1" / "log.txt", train_log(81.0))
    write(tmp_path / "seed1" / "log.txt-2024-03-05-14-07-09", CRASHED_LOG)
    result = pr.read_run(pr.find_runs(tmp_path)[0])
    assert result.value is None
    assert result.reason == ("log.txt-2024-03-05-14-07-09 has no end signal 'Finish training' "
                             "or 'Finished training' (crashed, still running, or needs --test-log)")


def test_results_json_rounded_to_printed_precision(tmp_path):
    run_dir = tmp_path / "seed1"
    write(run_dir / "log.txt", train_log(76.3))
    write(run_dir / "results.json", json.dumps(
        {"completed": True, "metrics": {"accuracy": 76.26315789, "macro_f1": 75.04}}))
    run, = pr.find_runs(tmp_path)
    rounded = pr.read_run(run)
    assert rounded.value == 76.3 and rounded.source.name == "results.json"
    assert rounded.value == pr.parse_log(run_dir / "log.txt")
    assert pr.read_run(run, full_precision=True).value == 76.26315789
    assert pr.read_run(run, keyword="macro_f1").value == 75.0


def test_results_json_not_completed_falls_back_to_log(tmp_path):
    run_dir = tmp_path / "seed1"
    write(run_dir / "log.txt", train_log(76.3))
    write(run_dir / "results.json", json.dumps({"completed": False, "metrics": {}}))
    result = pr.read_run(pr.find_runs(tmp_path)[0])
    assert result.value == 76.3 and result.source.name == "log.txt"


def test_a_truncated_results_json_is_named_beside_the_table(tmp_path, capsys):
    """The log's value is used, and a warning says that results.json could not be read and why."""
    run_dir = tmp_path / "seed1"
    write(run_dir / "log.txt", train_log(76.3))
    write(run_dir / "results.json", json.dumps({"completed": True, "metrics": {"accuracy": 76.26}})[:25])
    result = pr.read_run(pr.find_runs(tmp_path)[0])
    assert result.value == 76.3 and result.source.name == "log.txt"
    assert parse_results.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"warning: {run_dir / 'results.json'}: results.json is not readable JSON (" in err
    assert "the value is read from log.txt instead (as the log prints it, 1 decimal)" in err
    assert "76.30" in out


def test_results_json_only_run_without_completion_is_incomplete(tmp_path):
    write(tmp_path / "seed1" / "results.json", "{not json")
    result = pr.read_run(pr.find_runs(tmp_path)[0])
    assert result.value is None
    assert result.reason.startswith("results.json is not readable JSON")


def test_results_json_older_than_newest_log_is_ignored(tmp_path):
    run_dir = tmp_path / "seed1"
    write(run_dir / "log.txt", train_log(76.3))
    old = datetime(2024, 3, 5, 14, 0, 0).timestamp()
    write(run_dir / "results.json",
          json.dumps({"completed": True, "metrics": {"accuracy": 76.3}}), mtime=old)
    write(run_dir / "log.txt-2024-03-05-14-07-09", CRASHED_LOG)
    result = pr.read_run(pr.find_runs(tmp_path)[0])
    assert result.value is None
    assert any("older than log.txt-2024-03-05-14-07-09" in n for n in result.notes)


# ------------------------------------------------------------------- statistics


def test_aggregate_population_std_and_ci95():
    mean, std = pr.aggregate([80.0, 81.0, 82.5])
    assert mean == pytest.approx(81.1666667)
    assert std == pytest.approx(1.0274023)  # sqrt(((-7/6)^2 + (-1/6)^2 + (4/3)^2) / 3)
    assert pr.aggregate([80.0, 81.0, 82.5], ci95=True)[1] == pytest.approx(1.1626152)  # 1.96·std/√3
    assert pr.aggregate([70.0]) == (70.0, 0.0)
    with pytest.raises(ValueError, match="empty"):
        pr.aggregate([])


def test_harmonic_mean():
    assert pr.harmonic_mean(80.0, 60.0) == pytest.approx(68.5714286)  # 9600 / 140
    assert pr.harmonic_mean(0.0, 0.0) == 0.0


# ------------------------------------------------------------------ experiments


def build_experiments(root: Path):
    """CoOp few-shot layout: one experiment with a crashed seed, one with old logs."""
    coop = root / "dtd" / "CoOp" / "vit_b16_16shots" / "nctx16_cscFalse_ctpend"
    write(coop / "seed1" / "log.txt", train_log(80.0))
    write(coop / "seed2" / "log.txt", train_log(81.0))
    write(coop / "seed3" / "log.txt", train_log(82.5))
    write(coop / "seed10" / "log.txt", CRASHED_LOG)
    maple = root / "eurosat" / "MaPLe" / "old"
    write(maple / "seed1" / "log.txt", train_log(72.43, decimals=2, signal="Finished training"))
    write(maple / "seed2" / "log.txt", train_log(73.17, decimals=2, signal="Finished training"))


def test_collect_experiments_groups_seeds_and_lists_incomplete(tmp_path):
    build_experiments(tmp_path)
    report = pr.collect_experiments(tmp_path)
    names = [e.name for e in report.experiments]
    assert names == ["dtd/CoOp/vit_b16_16shots/nctx16_cscFalse_ctpend", "eurosat/MaPLe/old"]
    coop, maple = report.experiments
    assert list(coop.runs) == ["1", "2", "3"]
    assert (coop.mean, coop.spread) == pytest.approx((81.1666667, 1.0274023))
    assert maple.mean == pytest.approx(72.8)
    assert maple.spread == pytest.approx(0.37)
    assert [r.run.path.name for r in report.incomplete] == ["seed10"]
    assert report.average_of_means == pytest.approx((81.1666667 + 72.8) / 2)


def test_non_seed_run_folders_are_runs_of_their_parent(tmp_path):
    zs = tmp_path / "ZeroshotCLIP" / "vit_b16"
    write(zs / "dtd" / "log.txt", eval_only_log(44.5))
    write(zs / "caltech101" / "log.txt", eval_only_log(93.3))
    report = pr.collect_experiments(tmp_path, end_signals=pr.TEST_END_SIGNALS)
    exp, = report.experiments
    assert exp.name == "ZeroshotCLIP/vit_b16"
    assert list(exp.runs) == ["caltech101", "dtd"]
    assert exp.mean == pytest.approx(68.9)


def test_directory_that_is_itself_a_run_folder(tmp_path):
    write(tmp_path / "seed1" / "log.txt", train_log(66.6))
    exp, = pr.collect_experiments(tmp_path / "seed1").experiments
    assert exp.name == "." and list(exp.runs) == ["1"] and exp.mean == 66.6


@pytest.mark.e2e
def test_cli_table_via_subprocess(tmp_path):
    build_experiments(tmp_path)
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    coop_row = next(line for line in lines if "nctx16_cscFalse_ctpend" in line)
    cells = [c.strip() for c in coop_row.strip("|").split("|")]
    assert cells == ["dtd/CoOp/vit_b16_16shots/nctx16_cscFalse_ctpend", "3", "81.17 ± 1.03",
                     "1, 2, 3"]
    maple_row = next(line for line in lines if "eurosat/MaPLe/old" in line)
    assert "72.80 ± 0.37" in maple_row and "| 1, 2 " in maple_row
    assert "accuracy (mean ± std)" in proc.stdout
    assert "Incomplete runs (excluded):" in proc.stdout
    assert "seed10: log.txt has no end signal 'Finish training' or 'Finished training'" in proc.stdout
    assert "Average of" not in proc.stdout


def test_cli_ci95_multi_exp_and_json(tmp_path, capsys):
    build_experiments(tmp_path)
    out_json = tmp_path / "summary" / "res.json"
    assert parse_results.main([str(tmp_path), "--ci95", "--multi-exp", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "accuracy (mean ± 95% CI)" in out
    assert "81.17 ± 1.16" in out  # 1.96 * 1.0274 / sqrt(3)
    assert "72.80 ± 0.51" in out  # 1.96 * 0.37 / sqrt(2)
    assert "Average of 2 experiment means" in out and "76.98" in out
    payload = json.loads(out_json.read_text())
    assert payload["spread"] == "ci95"
    assert payload["experiments"][0]["runs"]["2"]["value"] == 81.0
    assert payload["incomplete"][0]["path"].endswith("seed10")


def test_cli_warns_on_stderr_about_several_logs(tmp_path, capsys):
    write(tmp_path / "exp" / "seed1" / "log.txt", CRASHED_LOG)
    write(tmp_path / "exp" / "seed1" / "log.txt-2024-03-05-14-07-09", train_log(81.0))
    assert parse_results.main([str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "using the newest, log.txt-2024-03-05-14-07-09" in captured.err
    assert "81.00 ± 0.00" in captured.out


@pytest.mark.e2e
def test_cli_errors(tmp_path, capsys):
    missing = run_cli(tmp_path / "nope")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr

    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert parse_results.main([str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "No run folder found" in err
    assert "log.txt, log.txt-YYYY-MM-DD-HH-MM-SS or results.json" in err

    write(tmp_path / "evalonly" / "seed1" / "log.txt", eval_only_log(70.0))
    assert parse_results.main([str(tmp_path / "evalonly")]) == 1
    err = capsys.readouterr().err
    assert "none has a '* accuracy: X%' line after 'Finish training' or 'Finished training'" in err
    assert "--test-log" in err
    assert parse_results.main([str(tmp_path / "evalonly"), "--test-log"]) == 0
    assert "70.00 ± 0.00" in capsys.readouterr().out


# --------------------------------------------------------------------- base2new

BASE2NEW = {  # dataset -> (base accuracies of seeds 1-3, novel accuracies of seeds 1-3)
    "dtd": ((80.1, 79.6, 81.0), (55.3, 56.9, 54.8)),
    "caltech101": ((97.2, 97.5, 97.9), (94.1, 93.8, 94.4)),
}
TAIL = Path("shots_16") / "CoCoOp" / "vit_b16_c4_ep10_batch1_ctxv1"


def build_base2new(root: Path, base_side: str = "train_base"):
    """train_base holds training logs; test_base (released-weights layout) eval-only logs."""
    base_log = train_log if base_side == "train_base" else eval_only_log
    for dataset, (base, novel) in BASE2NEW.items():
        for seed, (b, n) in enumerate(zip(base, novel), start=1):
            write(root / base_side / dataset / TAIL / f"seed{seed}" / "log.txt", base_log(b))
            write(root / "test_new" / dataset / TAIL / f"seed{seed}" / "log.txt", eval_only_log(n))


def test_collect_base2new_numbers(tmp_path):
    build_base2new(tmp_path)
    report = pr.collect_base2new(tmp_path / "train_base", tmp_path / "test_new")
    group, = report.groups
    assert (group.trainer, group.cfg, group.shots) == (
        "CoCoOp", "vit_b16_c4_ep10_batch1_ctxv1", "shots_16")
    caltech, dtd = group.rows  # published table order: caltech101 before dtd
    assert caltech.dataset == "caltech101" and dtd.dataset == "dtd"
    # caltech101: B = 292.6/3, N = 282.3/3, HM = 2*292.6*94.1/574.9
    assert (caltech.base, caltech.novel, caltech.hm) == pytest.approx((97.5333333, 94.1, 95.7859106))
    # dtd: B = 240.7/3, N = 167.0/3, HM = 2*240.7*167.0/(3*407.7)
    assert (dtd.base, dtd.novel, dtd.hm) == pytest.approx((80.2333333, 55.6666667, 65.7295397))
    # Average: B = 533.3/6, N = 449.3/6, HM of the two means (not the mean of HMs, 80.7577)
    assert group.average() == pytest.approx((88.8833333, 74.8833333, 81.2849210))
    assert report.incomplete == []


@pytest.mark.e2e
def test_cli_base2new_layout_detected(tmp_path):
    build_base2new(tmp_path)
    # a crashed extra seed must be listed, not averaged
    write(tmp_path / "train_base" / "dtd" / TAIL / "seed4" / "log.txt", CRASHED_LOG)
    # a re-run of seed 1 replaces a crashed first attempt
    seed1 = tmp_path / "test_new" / "dtd" / TAIL / "seed1"
    (seed1 / "log.txt").rename(seed1 / "log.txt-2024-03-05-14-07-09")
    write(seed1 / "log.txt", CRASHED_LOG)
    proc = run_cli(tmp_path, "--json", tmp_path / "b2n.json")
    assert proc.returncode == 0, proc.stderr
    assert "seed1 holds 2 logs (log.txt, log.txt-2024-03-05-14-07-09)" in proc.stderr
    out = proc.stdout
    assert "CoCoOp / vit_b16_c4_ep10_batch1_ctxv1 / shots_16" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ")}
    assert rows["caltech101"] == ["caltech101", "97.53", "94.10", "95.79", "1, 2, 3", "1, 2, 3"]
    assert rows["dtd"] == ["dtd", "80.23", "55.67", "65.73", "1, 2, 3", "1, 2, 3"]
    assert rows["Average (2 datasets)"][1:4] == ["88.88", "74.88", "81.28"]
    assert "seed4: log.txt has no end signal" in out
    payload = json.loads((tmp_path / "b2n.json").read_text())
    assert payload["groups"][0]["average"]["hm"] == pytest.approx(81.2849210)
    assert payload["groups"][0]["datasets"][1]["novel_values"] == {"1": 55.3, "2": 56.9, "3": 54.8}


def test_base2new_released_weights_layout_reads_test_base(tmp_path, capsys):
    build_base2new(tmp_path, base_side="test_base")
    assert parse_results.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Base from " + str(tmp_path / "test_base") + " ('* accuracy: X%' after '=> result')" in out
    average_row = next(line for line in out.splitlines() if "| Average" in line)
    assert [c.strip() for c in average_row.strip("|").split("|")][1:4] == ["88.88", "74.88", "81.28"]


def test_base2new_dataset_missing_novel_is_not_averaged(tmp_path, capsys):
    build_base2new(tmp_path)
    write(tmp_path / "train_base" / "eurosat" / TAIL / "seed1" / "log.txt", train_log(90.0))
    assert parse_results.main(["--base", str(tmp_path / "train_base"),
                    "--new", str(tmp_path / "test_new")]) == 0
    out = capsys.readouterr().out
    eurosat_row = next(line for line in out.splitlines() if "| eurosat" in line)
    assert [c.strip() for c in eurosat_row.strip("|").split("|")] == [
        "eurosat", "90.00", "-", "-", "1", "-"]
    assert "Not in Average (Base or Novel missing): eurosat" in out
    assert "88.88" in out and "81.28" in out


def test_base2new_unrecognised_path_is_reported(tmp_path):
    build_base2new(tmp_path)
    write(tmp_path / "test_new" / "dtd" / "CoCoOp" / "seed1" / "log.txt", eval_only_log(50.0))
    report = pr.collect_base2new(tmp_path / "train_base", tmp_path / "test_new")
    bad, = report.incomplete
    assert bad.reason.endswith("is not DATASET/shots_K/TRAINER/CFG/seedS")
    assert report.groups[0].rows[1].novel == pytest.approx(55.6666667)
