"""Kill and resume of the ttt protocol: ``tools/run_protocol.py --protocol ttt`` killed
with SIGKILL and started again with the same command ends with the uninterrupted run's accuracy
and the same per-image episode log (labels and logits, byte for byte).

TPT (configs/trainers/TPT/synthetic.yaml, 8 views) adapts the 12 test images of a miniature
OxfordPets, the one target of a benchmark file written by the test, with the tests' tiny random
CLIP (smaller than the synthetic config's CLIP, which kill and resume are not about). Each grid runs in a process forked from a forkserver that imported train.py once. Kill
points: "episode" (after the n-th image's episode, before its record is written) or "time" (after
a seeded random share of the uninterrupted run's time, whatever the run is doing); a trial
kills once or twice before a last call finishes the grid.
"""
import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest
from forked_runs import enter_child, forkserver_context, launch

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
TEST_IMAGES = 3 * 4  # 3 classes x 4 test images
TRIAL_SEED = 20261126


def _arm_episode_kill(count):
    """Make this process SIGKILL itself when the ``count``-th image's record is about to be logged
    (that image adapted, its prediction not yet on disk)."""
    from vlprompt.engine.test_time import EpisodeLog

    append = EpisodeLog.append
    records = [0]

    def killing_append(self, label, logits):
        records[0] += 1
        if records[0] == count:
            os.kill(os.getpid(), signal.SIGKILL)
        return append(self, label, logits)

    EpisodeLog.append = killing_append


def _grid_child(argv, kill):
    """Process target: run the grid (output silenced), armed to die at ``kill``."""
    enter_child()
    if kill is not None and kill[0] == "episode":
        _arm_episode_kill(kill[1])
    from vlprompt_app.commands import run_protocol

    sys.exit(run_protocol.main(argv))


@pytest.fixture(scope="module")
def context():
    return forkserver_context()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_clip_files):
    """(data root, benchmark file, CLIP files): the miniature OxfordPets, a ttt benchmark targeting
    it and the tests' tiny CLIP."""
    from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree

    base = tmp_path_factory.mktemp("kill_resume_ttt")
    write_oxford_pets_tree(str(base / "data"), classes=OXFORD_PETS_TOY_CLASSES[:3], train=1, val=1, test=4)
    benchmark = base / "toy_ttt.yaml"
    benchmark.write_text("seeds: [1]\nttt:\n  source: oxford_pets\n  targets: [oxford_pets]\n  shots: 1\n")
    return base / "data", benchmark, tiny_clip_files


def _argv(setup, output):
    data, benchmark, (clip_config, clip_weights) = setup
    return ["--benchmark", str(benchmark), "--protocol", "ttt", "--root", str(data), "--output", str(output),
            "--in-process", "--trainers", "TPT:synthetic", "--test-opts", "TRAINER.TPT.NUM_VIEWS", "8",
            "--opts", "MODEL.BACKBONE.NAME", clip_config, "MODEL.BACKBONE.WEIGHTS", clip_weights]


def _launch(context, argv, kill=None):
    """Run the grid in a forked process; return (exit code, seconds)."""
    return launch(context, _grid_child, argv, kill)


def _run_folder(output):
    return output / "ttt" / "TPT" / "synthetic" / "none" / "oxford_pets" / "seed1"


def _final(output):
    """(accuracy, images adapted by the last call, episode log bytes) of a finished run."""
    folder = _run_folder(output)
    results = json.loads((folder / "results.json").read_text())
    assert results["completed"] is True
    log = (folder / "test_time" / "test.bin").read_bytes()
    return results["metrics"]["accuracy"], results["test_time"]["images"], log


@pytest.fixture(scope="module")
def uninterrupted(context, setup, tmp_path_factory):
    output = tmp_path_factory.mktemp("ttt_uninterrupted")
    code, seconds = _launch(context, _argv(setup, output))
    assert code == 0
    accuracy, adapted, log = _final(output)
    assert adapted == TEST_IMAGES
    return (accuracy, log), seconds


def test_killed_ttt_grids_resume_to_the_uninterrupted_accuracy_and_log(context, setup, uninterrupted, tmp_path):
    (accuracy, log), seconds = uninterrupted
    rng = random.Random(TRIAL_SEED)
    plans = [[("episode", 5)], [("episode", 1), ("episode", 9)],
             [("time", round(rng.uniform(0.2, 0.9) * seconds, 2))]]
    for trial, plan in enumerate(plans):
        output = tmp_path / f"trial{trial}"
        argv = _argv(setup, output)
        for kill in plan:
            code, _ = _launch(context, argv, kill)
            if kill[0] == "episode":
                assert code == -signal.SIGKILL, (trial, plan, code)
            assert code in (0, -signal.SIGKILL), (trial, plan, code)
        code, _ = _launch(context, argv)
        assert code == 0, (trial, plan)
        resumed_accuracy, adapted, resumed_log = _final(output)
        assert resumed_accuracy == accuracy and resumed_log == log, (trial, plan)
        if plan[-1][0] == "episode":  # the finishing call adapted only the images after the last kill
            assert adapted == TEST_IMAGES - (plan[-1][1] - 1), (trial, plan, adapted)
