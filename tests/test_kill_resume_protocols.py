"""Kill and resume of protocol grids: ``tools/run_protocol.py`` started as a process of its own
(forked from a forkserver that imported torch once) in a session of its own, its process group
killed with SIGKILL at a seeded random moment, and the same command started again until it
finishes, ends with the uninterrupted grid's results.

Two grids on a miniature OxfordPets (4 classes, 2 of them base, 2 new; 2 train, 1 val and 5 test
images per class) with the tests' tiny random CLIP (smaller than the synthetic configs' CLIP, which
the grids are not about), each call running its runs in-process (``--in-process``: one interpreter
per call, so the process group is the whole grid):

* fft: RAdaFFT stage 1 (2 epochs, batches of 4), then stage 2 from stage 1's epoch 1, each
  evaluated on the source's test split and on the target: 4 runs in one chain;
* base2new: CoOp and RAda (its feature cache written into the data root), each trained on the
  base classes and tested on the new ones: 4 runs in 2 chains.

Kill moments (seeded draws, resolved against what is on disk when a call starts; see
_kill_moment): a "run" kill lets a drawn number of the call's pending runs end (the test reads the
progress lines as they come) and kills after a drawn share of the next run's uninterrupted
duration, so it lands anywhere in the grid's work (train.py import, data and feature-cache
loading, training steps, checkpoint writes, evaluation) but never after its end; a "checkpoint"
kill comes as soon as a drawn epoch checkpoint appears (polled every 5 ms; an epoch takes ~0.04 s) (every epoch is saved,
TRAIN.CHECKPOINT_FREQ 1), so the next call resumes that training run from it. Trials 0 and 1
kill twice (a run kill, a checkpoint kill; the second hits a call resuming the grid). Every trial starts from a fresh
copy of the data (the few-shot split and the feature cache are written there while a run may be
killed).

Compared with the uninterrupted grid: the parse_results table (byte for byte), every results.json
(byte for byte once its wall time, finish time and the output root are set aside) and the model
weights of every checkpoint file. A run folder whose lock the kill left behind is taken over by
the next call, which says so in that run's console.txt.
"""
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from forked_runs import ForkedScript

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
TRIAL_SEED = 20261127
PROGRESS = re.compile(r"^\[\s*(\d+)/(\d+)\] \S+\s+([\d.]+)s ")
VOLATILE_RESULT_KEYS = ("wall_time_s", "finished_at")

GRIDS = {
    "fft": ["--protocol", "fft", "--trainers", "RAdaFFT:synthetic_stage1@1:synthetic_stage2",
            "--train-opts", "OPTIM.MAX_EPOCH", "2", "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "TRAIN.CHECKPOINT_FREQ", "1"],
    "base2new": ["--protocol", "base2new", "--trainers", "CoOp:synthetic", "RAda:synthetic",
                 "--opts", "OPTIM.MAX_EPOCH", "3", "DATALOADER.TRAIN_X.BATCH_SIZE", "2", "TRAIN.CHECKPOINT_FREQ", "1"],
}
BENCHMARK = ("seeds: [1]\n"
             "fft:\n  source: oxford_pets\n  targets: [oxford_pets]\n  shots: 0\n"
             "base2new:\n  datasets: [oxford_pets]\n  shots: 1\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_clip_files):
    """(pristine data root, benchmark file, CLIP files): the miniature OxfordPets, a benchmark
    defining fft and base2new on it and the tiny CLIP's config and weights."""
    from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree

    base = tmp_path_factory.mktemp("kill_resume_protocols")
    write_oxford_pets_tree(str(base / "data"), classes=OXFORD_PETS_TOY_CLASSES[:4], train=2, val=1, test=5)
    benchmark = base / "toy_protocols.yaml"
    benchmark.write_text(BENCHMARK)
    return base / "data", benchmark, tiny_clip_files


class Call:
    """One ``tools/run_protocol.py`` command, started in a new session (its own process group)
    with its output going to ``stdout_path`` (a process forked from the forkserver: see
    forked_runs.ForkedScript)."""

    def __init__(self, argv, stdout_path: Path):
        self.stdout_path = stdout_path
        self.started = time.time()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.process = ForkedScript([sys.executable, str(ROOT / "tools" / "run_protocol.py"), *argv],
                                    stdout_path, stdout_path, env=env, new_session=True)

    def lines(self):
        return self.stdout_path.read_text().splitlines()

    def wait_for_line(self, count: int, timeout: float = 300.0) -> None:
        """Block until the "Grid:" line (``count`` 0) or the ``count``-th progress line is out."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            lines = self.lines()
            if count == 0:
                if any(line.startswith("Grid:") for line in lines):
                    return
            elif sum(bool(PROGRESS.match(line)) for line in lines) >= count:
                return
            if self.process.poll() is not None:
                raise AssertionError(f"the call ended before line {count}:\n" + "\n".join(lines))
            time.sleep(0.02)
        raise AssertionError(f"no line {count} within {timeout} s")

    def wait_for_checkpoints(self, output: Path, count: int, timeout: float = 300.0) -> None:
        """Block until ``output`` holds ``count`` checkpoint files."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(_checkpoints(output)) >= count:
                return
            if self.process.poll() is not None:
                raise AssertionError(f"the call ended before checkpoint {count}:\n" + "\n".join(self.lines()))
            time.sleep(0.005)
        raise AssertionError(f"no checkpoint {count} within {timeout} s")

    def kill_group(self) -> bool:
        """SIGKILL the call's whole process group; False when the grid had ended already (it
        must then have succeeded)."""
        if self.process.poll() is not None:
            assert self.process.returncode == 0, "\n".join(self.lines())
            return False
        os.killpg(self.process.pid, signal.SIGKILL)
        assert self.process.wait(60) == -signal.SIGKILL
        return True

    def finish(self, timeout: float = 300.0) -> int:
        return self.process.wait(timeout)


def _checkpoints(output: Path):
    return sorted(output.rglob("model.pth.tar-*"))


def _argv(setup, grid, data, output):
    """The grid's command, every run of it with the tiny CLIP (added to its --opts)."""
    _, benchmark, (clip_config, clip_weights) = setup
    argv = ["--benchmark", str(benchmark), "--root", str(data), "--output", str(output), "--in-process",
            *GRIDS[grid]]
    backbone = ["MODEL.BACKBONE.NAME", clip_config, "MODEL.BACKBONE.WEIGHTS", clip_weights]
    if "--opts" not in argv:
        return [*argv, "--opts", *backbone]
    at = argv.index("--opts") + 1
    return [*argv[:at], *backbone, *argv[at:]]


def _fresh_data(setup, folder: Path) -> Path:
    pristine = setup[0]
    shutil.copytree(pristine, folder)
    return folder


def _table(setup, grid, output) -> str:
    """The grid's table as ``tools/parse_results.py --format markdown`` prints it."""
    from vlprompt_app.commands import parse_results

    benchmark = setup[1]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = parse_results.main([str(output), "--benchmark", str(benchmark), "--protocol", grid,
                                   "--format", "markdown"])
    assert code == 0, printed.getvalue()
    return printed.getvalue()


def _final(setup, grid, output: Path):
    """(table, results files, checkpoint weights) of a finished grid in ``output``: the results as
    text with the output root written OUT and the volatile keys removed, the weights as tensors,
    both keyed by their path below ``output``."""
    results = {}
    for path in sorted(output.rglob("results.json")):
        content = json.loads(path.read_text().replace(str(output), "OUT"))
        assert content["completed"] is True, path
        for key in VOLATILE_RESULT_KEYS:
            content.pop(key)
        results[path.relative_to(output).as_posix()] = json.dumps(content, indent=1)
    weights = {path.relative_to(output).as_posix(): torch.load(path, weights_only=True)["state_dict"]
               for path in _checkpoints(output)}
    return _table(setup, grid, output), results, weights


def _run_seconds(lines):
    """Run label -> seconds, from the progress lines, in the order the runs ran."""
    return {line.split()[-1]: float(match.group(3)) for line in lines for match in [PROGRESS.match(line)] if match}


def _uninterrupted(setup, grid, base: Path):
    output = base / "uninterrupted"
    call = Call(_argv(setup, grid, _fresh_data(setup, base / "data_uninterrupted"), output), base / "uninterrupted.txt")
    assert call.finish() == 0, "\n".join(call.lines())
    seconds = _run_seconds(call.lines())
    assert len(seconds) == 4, call.lines()
    return _final(setup, grid, output), seconds, len(_checkpoints(output))


def _kill_plans(grid, trials):
    """Per trial, the kills before the finishing call as (kind, u, f), u and f shares in [0, 1)
    (see :func:`_kill_moment`): trial 0 a "run" kill and then a "checkpoint" kill of the call
    resuming the grid, trial 1 the other way round; later trials one or two kills of drawn kinds."""
    rng = random.Random(f"{TRIAL_SEED}-{grid}")
    kinds = [["run", "checkpoint"], ["checkpoint", "run"]]
    while len(kinds) < trials:
        kinds.append([rng.choice(["run", "checkpoint"]) for _ in range(rng.randint(1, 2))])
    return [[(kind, round(rng.random(), 3), round(rng.uniform(0.1, 0.9), 3)) for kind in plan]
            for plan in kinds[:trials]]


def _kill_moment(output: Path, run_seconds, checkpoints: int, draw):
    """Where a call starting on ``output`` is killed, for the draw (kind, u, f) (None when the
    grid is complete):

    * ("run", r, seconds): of the P runs not yet completed, r = floor(u (P - 1)) end and the next
      one runs for f times its uninterrupted seconds; at least one run is still to come then (or,
      for P = 1, its train.py import is), so the call is mostly still running (runs take
      fractions of a second, so on a machine much faster than during the uninterrupted grid it
      may have ended);
    * ("checkpoint", k, 0): as soon as the k-th checkpoint file of the grid (of ``checkpoints`` in
      all) is seen, k drawn by u among those not yet on disk (a "run" kill when all are): mostly
      while its run is still training or evaluating.
    """
    from vlprompt_app.protocols.execute import is_completed

    kind, u, f = draw
    present = len(_checkpoints(output))
    if kind == "checkpoint" and present < checkpoints:
        return kind, present + 1 + int(u * (checkpoints - present)), 0.0
    pending = [label for label in run_seconds if not is_completed(output / label)]
    if not pending:
        return None
    after = int(u * (len(pending) - 1))
    return "run", after, round(f * run_seconds[pending[after]], 2)


def _assert_resumes_to_the_uninterrupted_grid(setup, grid, base: Path, trials: range):
    """Run the kill plans of the trial numbers ``trials``: each must end with the uninterrupted
    grid's table, results and weights."""
    (table, results, weights), run_seconds, checkpoints = _uninterrupted(setup, grid, base)
    plans = _kill_plans(grid, trials.stop)
    for trial in trials:
        data = _fresh_data(setup, base / f"data{trial}")
        output = base / f"trial{trial}"
        argv = _argv(setup, grid, data, output)
        plan, killed = [], []
        for number, draw in enumerate(plans[trial]):
            moment = _kill_moment(output, run_seconds, checkpoints, draw)
            if moment is None:
                break
            kind, count, delay = moment
            plan.append(moment)
            call = Call(argv, base / f"trial{trial}_kill{number}.txt")
            if kind == "run":
                call.wait_for_line(count)
            else:
                call.wait_for_checkpoints(output, count)
            time.sleep(delay)
            killed.append(call.kill_group())
        assert any(killed), (trial, plan, "no call was killed before the grid ended")
        left_locks = [lock.parent for lock in output.rglob("run.lock")]
        call = Call(argv, base / f"trial{trial}_finish.txt")
        assert call.finish() == 0, (trial, plan, call.lines())
        resumed_table, resumed_results, resumed_weights = _final(setup, grid, output)
        assert resumed_table == table, (trial, plan)
        assert resumed_results == results, (trial, plan)
        assert resumed_weights.keys() == weights.keys(), (trial, plan)
        for name, state in weights.items():
            assert resumed_weights[name].keys() == state.keys(), (trial, plan, name)
            for key, value in state.items():
                assert torch.equal(resumed_weights[name][key], value), (trial, plan, name, key)
        assert list(output.rglob("run.lock")) == [], (trial, plan)
        for folder in left_locks:
            assert "Taking over the stale lock" in (folder / "console.txt").read_text(), (trial, plan, folder)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_killed_grids_resume_to_the_uninterrupted_grid(setup, tmp_path, grid):
    _assert_resumes_to_the_uninterrupted_grid(setup, grid, tmp_path, trials=range(0, 2))
