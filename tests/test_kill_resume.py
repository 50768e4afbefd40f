"""Kill and resume: train.py killed with SIGKILL at random and at chosen points and started again
with the same command ends with the uninterrupted run's exact weights, optimizer and scheduler
states and metrics.

CoOp trains on the synthetic benchmark's base classes (SyntheticShapes, 1 shot, with
configs/trainers/CoOp/synthetic.yaml) with a tiny random CLIP: 2 epochs of 5 batches, a
mid-epoch checkpoint every 2 iterations, a final evaluation on the validation split (sampled like
the training images: 40 images in 2 batches; the 1,000 test images would make each run twice as
long and resume the same way). Each run is a fresh process forked from a forkserver that imported
train.py once; a trial kills its first run (and maybe the restarted ones) with SIGKILL, then lets
a restart finish. The first test's 5 trials draw their kill points at random (seeded; its first
four trials cover each kind); the slow test's trials chain kills chosen so that, with the first
test's, every training step, checkpoint file and evaluation batch of the run is a kill point, and
kill at three more moments. Kinds of kill points:

* "step":       at the start of the n-th training step (mid-epoch);
* "checkpoint": in the middle of writing the n-th checkpoint file (half of it written);
* "evaluation": at the n-th batch of the final evaluation;
* "time":       after a random delay, whatever the run is doing (data loading, cache writing, ...).
"""
import io
import itertools
import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest
import torch
from forked_runs import enter_child, forkserver_context, launch

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 2
STEPS = 2 * 5  # 1 shot x 40 base classes = 40 images, batch size 8
CHECKPOINT_FILE_WRITES = 4 + 1  # mid-epoch after iterations 2, 4, 6, 8; the final epoch checkpoint
TEST_BATCHES = 2  # 1 shot x 40 base classes = 40 validation images, batch size 20
KILL_KINDS = ("step", "checkpoint", "evaluation", "time")
TRIAL_SEED = 20240611


def _arm(kind, count):
    """Make this process SIGKILL itself at the ``count``-th event of ``kind`` (see module docstring)."""
    calls = itertools.count(1)

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if kind == "step":
        from vlprompt.engine import ClipTrainer

        forward_backward = ClipTrainer.forward_backward

        def killing_forward_backward(self, batch):
            if next(calls) == count:
                die()
            return forward_backward(self, batch)

        ClipTrainer.forward_backward = killing_forward_backward
    elif kind == "checkpoint":
        save = torch.save

        def killing_save(obj, f, *args, **kwargs):
            if next(calls) != count:
                return save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            die()

        torch.save = killing_save
    elif kind == "evaluation":
        from vlprompt.evaluation.evaluator import Classification

        process = Classification.process

        def killing_process(self, mo, gt):
            if next(calls) == count:
                die()
            return process(self, mo, gt)

        Classification.process = killing_process


def _train_child(argv, kill):
    """Process target: run train.py with ``argv`` (output silenced), armed to die at ``kill``."""
    enter_child()
    if kill is not None and kill[0] != "time":
        _arm(*kill)
    from vlprompt_app.commands import train

    sys.exit(train.run(argv))


@pytest.fixture(scope="module")
def context():
    return forkserver_context()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, synthetic_data):
    """(folder, CLIP config, CLIP weights, data root): a tiny random CLIP and the rendered SyntheticShapes set."""
    from vlprompt.testing import write_tiny_clip

    base = tmp_path_factory.mktemp("kill_resume")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-kill")
    return base, config, weights, synthetic_data


def _argv(setup, output_dir):
    base, config, weights, data = setup
    return [
        "--root", str(data), "--trainer", "CoOp", "--seed", "1", "--output-dir", str(output_dir),
        "--dataset-config-file", str(ROOT / "configs/datasets/synthetic_shapes.yaml"),
        "--config-file", str(ROOT / "configs/trainers/CoOp/synthetic.yaml"),
        "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights,
        "DATASET.NUM_SHOTS", "1", "DATASET.SUBSAMPLE_CLASSES", "base", "DATALOADER.TRAIN_X.BATCH_SIZE", "8",
        "OPTIM.MAX_EPOCH", str(EPOCHS), "TRAIN.CHECKPOINT_ITERS", "2", "OPTIM.MOMENTUM", "0.9",
        "TEST.SPLIT", "val", "DATALOADER.TEST.BATCH_SIZE", "20",
    ]


def _launch(context, argv, kill=None):
    """Run train.py in a forked process; return (exit code, seconds)."""
    return launch(context, _train_child, argv, kill)


def _final(output_dir):
    """(last checkpoint, metrics) of a finished run."""
    checkpoint = torch.load(output_dir / "prompt_learner" / f"model.pth.tar-{EPOCHS}", weights_only=True)
    results = json.loads((output_dir / "results.json").read_text())
    assert results["completed"] and results["epoch"] == EPOCHS and results["num_test"] == 40
    return checkpoint, results["metrics"]


@pytest.fixture(scope="module")
def uninterrupted(context, setup):
    output_dir = setup[0] / "uninterrupted"
    code, seconds = _launch(context, _argv(setup, output_dir))
    assert code == 0
    return _final(output_dir), seconds


def _kill_plans(trials, run_seconds):
    """Per trial, one or two kills (kind, count or delay); the first four trials cover every kind."""
    rng = random.Random(TRIAL_SEED)
    kinds = list(KILL_KINDS)
    rng.shuffle(kinds)
    limits = {"step": STEPS, "checkpoint": CHECKPOINT_FILE_WRITES, "evaluation": TEST_BATCHES}

    def draw(kind):
        if kind == "time":
            return kind, round(rng.uniform(0.1, 0.9) * run_seconds, 2)
        return kind, rng.randint(1, limits[kind])

    plans = []
    for trial in range(trials):
        first = draw(kinds[trial] if trial < len(kinds) else rng.choice(KILL_KINDS))
        plans.append([first] + ([draw(rng.choice(KILL_KINDS))] if rng.random() < 0.5 else []))
    return plans


# Trials of chained kills: each kill hits the run that resumed after the one before (a count is the
# n-th event of the killed process, which resumes after the last complete checkpoint: none, or after
# iteration 2, 4, 6 or 8). Chosen so that, with the trials of the test above (steps 3 and 6, checkpoint
# file 5, evaluation batch 2), every training step, checkpoint file and evaluation batch of the run is
# a kill point; every kill lands. In the run's terms:
CHAINED_PLANS = [
    [("step", 1), ("step", 2), ("checkpoint", 1)],  # steps 1 and 2 and checkpoint 1, each resuming from scratch
    [("step", 4), ("step", 3), ("step", 4)],  # steps 4, 5 and 8, resuming after iterations 2, 4 and 6
    [("step", 7), ("step", 3), ("step", 2), ("evaluation", 1)],  # steps 7, 9 and 10, evaluation batch 1
    [("checkpoint", 2), ("checkpoint", 2), ("checkpoint", 2)],  # checkpoints 2, 3 and 4, half written
]
# Kills after these shares of the uninterrupted run's seconds: early (loading), midway, late.
TIMED_PLANS = [[("time", 0.2), ("time", 0.5)], [("time", 0.8)]]


def _run_trials(context, setup, uninterrupted, tmp_path, plans, every_kill_lands=False):
    """Run each trial's kill plan (``plans``: trial number -> kills), then a last run to the end: each
    must resume to the uninterrupted run's weights, optimizer and scheduler states and metrics. A
    first run always reaches its kill point, and so does every kill of a plan when
    ``every_kill_lands`` (a timed kill may come after a run's end)."""
    (reference, reference_metrics), run_seconds = uninterrupted
    for trial, plan in plans.items():
        output_dir = tmp_path / f"trial{trial}"
        argv = _argv(setup, output_dir)
        for number, kill in enumerate(plan):
            code, _ = _launch(context, argv, kill)
            if kill[0] != "time" and (number == 0 or every_kill_lands):
                assert code == -signal.SIGKILL, (trial, plan, number, code)
            assert code in (0, -signal.SIGKILL), (trial, plan, code)
        code, _ = _launch(context, argv)
        assert code == 0, (trial, plan)
        checkpoint, metrics = _final(output_dir)
        assert metrics == reference_metrics, (trial, plan)
        for key, value in reference["state_dict"].items():
            assert torch.equal(checkpoint["state_dict"][key], value), (trial, plan, key)
        momentum = reference["optimizer"]["state"][0]["momentum_buffer"]
        assert torch.equal(checkpoint["optimizer"]["state"][0]["momentum_buffer"], momentum), (trial, plan)
        assert checkpoint["scheduler"] == reference["scheduler"], (trial, plan)
        leftovers = [p.name for p in (output_dir / "prompt_learner").iterdir() if p.name.startswith(".") or "-batch" in p.name]
        assert leftovers == [], (trial, plan)


def test_runs_killed_at_random_points_resume_to_the_same_result(context, setup, uninterrupted, tmp_path):
    plans = _kill_plans(5, uninterrupted[1])
    _run_trials(context, setup, uninterrupted, tmp_path, dict(enumerate(plans)))


@pytest.mark.slow
def test_runs_killed_at_every_step_checkpoint_and_evaluation_batch_resume_to_the_same_result(
        context, setup, uninterrupted, tmp_path):
    """CHAINED_PLANS and TIMED_PLANS: with the test above, every step, checkpoint file and evaluation
    batch of the run is a kill point, and kills come at three more moments."""
    run_seconds = uninterrupted[1]
    timed = [[(kind, round(share * run_seconds, 2)) for kind, share in plan] for plan in TIMED_PLANS]
    _run_trials(context, setup, uninterrupted, tmp_path, dict(enumerate(CHAINED_PLANS, 5)), every_kill_lands=True)
    _run_trials(context, setup, uninterrupted, tmp_path, dict(enumerate(timed, 5 + len(CHAINED_PLANS))))
