"""The run folder's lock: one process at a time runs into an OUTPUT_DIR.

Unit tests of vlprompt/engine/run_lock.py, then train.py processes (forked as tests/forked_runs.py
runs scripts, each its own process with its own pid): a second run of a held
folder refuses (exit status 2, naming the holder), a holder killed with SIGKILL leaves a stale
lock that the next run takes over, and an --eval-only run into its own folder runs beside a
holder of its --model-dir.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from forked_runs import ForkedScript, run_script

from vlprompt.engine.run_folder import RunFolder
from vlprompt.engine.run_lock import FOREIGN_LOCK_STALE_AFTER, LOCK_FILENAME, RunFolderBusyError
from vlprompt_app.protocols.execute import run_queue, run_sequential
from vlprompt_app.protocols.grid import Chain, Run

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid():
    """The pid of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _write_lock(folder, **record):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILENAME).write_text(json.dumps(record))


def test_the_lock_is_held_inside_the_block_and_removed_after_it(tmp_path):
    with RunFolder(tmp_path / "run").lock():
        holder = json.loads((tmp_path / "run" / LOCK_FILENAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert datetime.fromisoformat(holder["started"]).tzinfo is not None
    assert not (tmp_path / "run" / LOCK_FILENAME).exists()
    assert sorted(os.listdir(tmp_path / "run")) == []  # no temporary file left behind


def test_the_lock_is_released_when_the_run_raises(tmp_path):
    with pytest.raises(KeyError):
        with RunFolder(tmp_path).lock():
            raise KeyError("a failing run")
    assert not (tmp_path / LOCK_FILENAME).exists()


def test_a_live_holder_makes_a_second_taker_refuse_naming_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = "2026-01-02T03:04:05+00:00"
        _write_lock(tmp_path, pid=holder.pid, host=socket.gethostname(), started=started, token="x")
        with pytest.raises(RunFolderBusyError) as error:
            with RunFolder(tmp_path).lock():
                pass
    finally:
        holder.kill()
        holder.wait()
    message = str(error.value)
    assert f"pid {holder.pid} on host {socket.gethostname()}, started {started}" in message
    assert str(tmp_path / LOCK_FILENAME) in message
    assert json.loads((tmp_path / LOCK_FILENAME).read_text())["pid"] == holder.pid  # left alone


def test_the_lock_of_an_ended_process_is_taken_over_with_a_line(tmp_path, capsys):
    pid = _dead_pid()
    _write_lock(tmp_path, pid=pid, host=socket.gethostname(), started="2026-01-02T03:04:05+00:00", token="x")
    with RunFolder(tmp_path).lock():
        assert json.loads((tmp_path / LOCK_FILENAME).read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out
    assert f"Taking over the stale lock {tmp_path / LOCK_FILENAME} (pid {pid} on host" in out
    assert "its process is gone" in out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times come from /proc")
def test_a_reused_pid_does_not_keep_the_lock(tmp_path, capsys):
    """The holder's pid now runs a process started at another time (this one)."""
    _write_lock(tmp_path, pid=os.getpid(), host=socket.gethostname(), started="2026-01-02T03:04:05+00:00",
                process_start="1", token="x")
    with RunFolder(tmp_path).lock():
        pass
    assert "the pid now belongs to another process" in capsys.readouterr().out


def test_another_hosts_lock_holds_until_it_is_older_than_the_stated_age(tmp_path, capsys):
    now = datetime.now(timezone.utc)
    fresh = (now - FOREIGN_LOCK_STALE_AFTER + timedelta(minutes=5)).isoformat()
    _write_lock(tmp_path, pid=1, host="another-host.invalid", started=fresh, token="x")
    with pytest.raises(RunFolderBusyError, match="pid 1 on host another-host.invalid"):
        with RunFolder(tmp_path).lock():
            pass
    old = (now - FOREIGN_LOCK_STALE_AFTER - timedelta(minutes=5)).isoformat()
    _write_lock(tmp_path, pid=1, host="another-host.invalid", started=old, token="x")
    with RunFolder(tmp_path).lock():
        pass
    assert "it is from another host and older than 72 hours" in capsys.readouterr().out


def test_release_leaves_a_lock_that_is_no_longer_this_holders(tmp_path):
    with RunFolder(tmp_path).lock():
        _write_lock(tmp_path, pid=1, host="another-host.invalid", started="2026-01-02T03:04:05+00:00", token="y")
    assert json.loads((tmp_path / LOCK_FILENAME).read_text())["token"] == "y"


@pytest.mark.parametrize("backend", ["sequential", "queue"])
def test_no_backend_starts_two_runs_of_one_folder(tmp_path, backend):
    launched = []

    def launcher(run, env, console):
        launched.append(run)
        return 0

    folder = tmp_path / "oxford_pets" / "seed1"
    chains = [Chain((Run(str(folder), ("--seed", "1"), None, "a"),)),
              Chain((Run(str(tmp_path / "other"), (), None, "b"), Run(str(tmp_path / "oxford_pets" / ".." / "oxford_pets" / "seed1"),
                                                                      ("--seed", "2"), None, "c")))]
    with pytest.raises(ValueError, match=f"Two runs of the grid write .*seed1: train.py --seed 1 and train.py --seed 2"):
        if backend == "sequential":
            run_sequential(chains, launcher)
        else:
            run_queue(chains, launcher, ["0", "1"])
    assert launched == []


# ------------------------------------------------------------ real train.py processes

# train.py whose run waits, holding its folder, until the file named by LOCK_TEST_GO exists
PAUSED_TRAIN = """
import os, sys, time
import vlprompt.engine as engine
build_trainer = engine.build_trainer
def paused_build_trainer(cfg):
    while not os.path.exists(os.environ["LOCK_TEST_GO"]):
        time.sleep(0.05)
    return build_trainer(cfg)
engine.build_trainer = paused_build_trainer
from vlprompt_app.commands import train
sys.exit(train.run(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, synthetic_data):
    """(folder, CLIP config, CLIP weights, data root): a tiny random CLIP and the rendered SyntheticShapes set."""
    from vlprompt.testing import write_tiny_clip

    base = tmp_path_factory.mktemp("run_lock")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-lock")
    return base, config, weights, synthetic_data


def _argv(setup, output_dir, *extra):
    base, config, weights, data = setup
    return [
        "--root", str(data), "--trainer", "CoOp", "--seed", "1", "--output-dir", str(output_dir),
        "--dataset-config-file", str(ROOT / "configs/datasets/synthetic_shapes.yaml"),
        "--config-file", str(ROOT / "configs/trainers/CoOp/synthetic.yaml"), *extra,
        "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights,
        "DATASET.NUM_SHOTS", "1", "DATASET.SUBSAMPLE_CLASSES", "base", "OPTIM.MAX_EPOCH", "1",
        "TEST.SPLIT", "val",  # the 1-shot validation sample (40 images), not the 1,000 test images
    ]


def _env(go_file):
    return {**os.environ, "PYTHONPATH": str(ROOT), "LOCK_TEST_GO": str(go_file)}


def _start_paused(argv, go_file):
    """train.py started in a process that holds its folder and waits for ``go_file``; its output
    goes to ``paused.txt`` beside ``go_file``."""
    script = go_file.parent / "paused_train.py"
    script.write_text(PAUSED_TRAIN)
    output = go_file.parent / "paused.txt"
    return ForkedScript([sys.executable, str(script), *argv], output, output, env=_env(go_file))


def _wait_for_lock(folder, process):
    deadline = time.time() + 240
    while not (folder / LOCK_FILENAME).exists():
        assert process.poll() is None, (folder.parent / "paused.txt").read_text()[-3000:]
        assert time.time() < deadline, "the paused run never took its folder"
        time.sleep(0.1)
    return json.loads((folder / LOCK_FILENAME).read_text())


def _train(argv, go_file):
    return run_script([sys.executable, "train.py", *argv], env=_env(go_file), timeout=300)


@pytest.mark.e2e
def test_two_train_py_processes_never_run_one_folder(setup, tmp_path):
    go = tmp_path / "go"
    run = tmp_path / "run"
    argv = _argv(setup, run)

    first = _start_paused(argv, go)
    holder = _wait_for_lock(run, first)
    assert holder["pid"] == first.pid
    second = _train(argv, go)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"pid {first.pid} on host {socket.gethostname()}, started {holder['started']}" in second.stderr
    assert "Traceback" not in second.stderr
    assert "No checkpoint found" not in second.stdout
    # the holder's log and config; the refused run wrote nothing (no second, timestamped log)
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "log.txt", LOCK_FILENAME]

    os.kill(first.pid, signal.SIGKILL)  # the lock stays behind, stale
    first.wait()
    assert json.loads((run / LOCK_FILENAME).read_text())["pid"] == first.pid
    go.touch()
    third = _train(argv, go)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert f"Taking over the stale lock {run / LOCK_FILENAME} (pid {first.pid} on host" in third.stdout
    assert RunFolder(run).completed and not (run / LOCK_FILENAME).exists()

    # a retraining run holds the folder; an evaluation of its model into another folder runs beside it
    go.unlink()
    retrain = _start_paused(argv, go)
    _wait_for_lock(run, retrain)
    evaluation = _train(_argv(setup, tmp_path / "eval", "--eval-only", "--model-dir", str(run),
                              "--load-epoch", "1"), go)
    assert evaluation.returncode == 0, evaluation.stdout[-3000:] + evaluation.stderr[-3000:]
    assert RunFolder(tmp_path / "eval").completed and not (tmp_path / "eval" / LOCK_FILENAME).exists()
    go.touch()
    assert retrain.wait(300) == 0, (tmp_path / "paused.txt").read_text()[-3000:]
    assert not (run / LOCK_FILENAME).exists()

