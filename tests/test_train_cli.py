"""End to end through train.py: CoOp on a miniature OxfordPets tree with a tiny CLIP file.

Covers the foundation's acceptance: loss goes down, log lines, checkpoints, eval-only
reproduces the reported accuracy, resume from epoch 1 equals an uninterrupted run, and
clear errors for bad input.
"""
import json
import os
import re
import shutil
import sys

import pytest
import torch
from forked_runs import run_script

from vlprompt.testing import write_oxford_pets_tree, write_tiny_clip

EPOCHS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-cli")
    write_oxford_pets_tree(str(base / "data"), train=12, val=2, test=6)
    return base, config, weights


def train_argv(setup, output_dir, *extra):
    """train.py arguments; ``extra`` flags (--x value) override the defaults, KEY VALUE pairs go last."""
    base, config, weights = setup
    flags = {
        "--root": str(base / "data"), "--trainer": "CoOp",
        "--dataset-config-file": "configs/datasets/oxford_pets.yaml",
        "--config-file": "configs/trainers/CoOp/toy.yaml",
        "--output-dir": str(output_dir), "--seed": "1",
    }
    switches, opts = [], []
    items = list(extra)
    while items:
        item = items.pop(0)
        if item in ("--eval-only", "--no-train"):
            switches.append(item)
        elif item.startswith("--"):
            flags[item] = items.pop(0)
        else:
            opts += [item, items.pop(0)]
    return [*[x for kv in flags.items() for x in kv], *switches,
            "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights,
            "OPTIM.MAX_EPOCH", str(EPOCHS), "TRAIN.CHECKPOINT_FREQ", "1", "TRAINER.COOP.CSC", "True", *opts]


def run_train(setup, output_dir, *extra):
    """Run the command ``python train.py ...`` in a forked process (tests/forked_runs.py; the exit
    status of train.py in a new interpreter is checked by tests/test_startup.py); it must succeed."""
    result = run_script([sys.executable, "train.py", *train_argv(setup, output_dir, *extra)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def epoch_losses(log_text):
    """Average loss of each epoch: the running average printed on its last line."""
    last = {}
    for epoch, avg in re.findall(r"epoch \[(\d+)/\d+\] batch \[\d+/\d+\] .* loss [\d.]+ \(([\d.]+)\)", log_text):
        last[int(epoch)] = float(avg)
    return [last[e] for e in sorted(last)]


@pytest.fixture(scope="module")
def trained(setup):
    output_dir = setup[0] / "run"
    run_train(setup, output_dir)
    return output_dir


@pytest.mark.e2e
def test_training_writes_logs_checkpoints_and_results(trained):
    log = (trained / "log.txt").read_text()
    losses = epoch_losses(log)
    assert len(losses) == EPOCHS
    assert losses[-1] < losses[1] - 0.05, losses  # epoch 1 is the 1e-5 warm-up
    for line in ("Finish training", "Deploy the last-epoch model", "Evaluate on the *test* set", "=> result"):
        assert line in log
    assert re.search(r"^\* accuracy: \d+\.\d%$", log, re.M)
    assert re.search(r"^Elapsed: \d+:\d\d:\d\d$", log, re.M)
    folder = trained / "prompt_learner"
    assert sorted(os.listdir(folder)) == ["checkpoint"] + [f"model.pth.tar-{i}" for i in range(1, EPOCHS + 1)]
    assert (folder / "checkpoint").read_text() == f"model.pth.tar-{EPOCHS}\n"
    checkpoint = torch.load(folder / f"model.pth.tar-{EPOCHS}", weights_only=True)
    assert list(checkpoint["state_dict"]) == ["ctx"]  # frozen CLIP and class buffers not saved
    results = json.loads((trained / "results.json").read_text())
    assert results["trainer"] == "CoOp" and results["dataset"] == "OxfordPets"
    assert results["completed"] and results["epoch"] == EPOCHS and results["seed"] == 1
    printed = float(re.findall(r"^\* accuracy: ([\d.]+)%$", log, re.M)[-1])
    assert round(results["metrics"]["accuracy"], 1) == printed


@pytest.mark.e2e
def test_eval_only_reproduces_the_reported_accuracy(setup, trained):
    output_dir = setup[0] / "eval"
    run_train(setup, output_dir, "--eval-only", "--model-dir", str(trained), "--load-epoch", str(EPOCHS))
    trained_metrics = json.loads((trained / "results.json").read_text())["metrics"]
    eval_results = json.loads((output_dir / "results.json").read_text())
    assert eval_results["metrics"]["accuracy"] == trained_metrics["accuracy"]
    assert eval_results["eval_only"] and eval_results["epoch"] == EPOCHS
    assert "Loading weights to prompt_learner" in (output_dir / "log.txt").read_text()
    assert not (output_dir / "prompt_learner").exists()


@pytest.mark.e2e
def test_resume_from_epoch_one_equals_uninterrupted_run(setup, trained):
    output_dir = setup[0] / "resumed"
    (output_dir / "prompt_learner").mkdir(parents=True)
    shutil.copy(trained / "prompt_learner" / "model.pth.tar-1", output_dir / "prompt_learner")
    (output_dir / "prompt_learner" / "checkpoint").write_text("model.pth.tar-1\n")
    run_train(setup, output_dir)
    log = (output_dir / "log.txt").read_text()
    assert "resum" in log.lower()
    final = f"prompt_learner/model.pth.tar-{EPOCHS}"
    a = torch.load(trained / final, weights_only=True)
    b = torch.load(output_dir / final, weights_only=True)
    assert torch.equal(a["state_dict"]["ctx"], b["state_dict"]["ctx"])
    assert a["scheduler"] == b["scheduler"]
    full = json.loads((trained / "results.json").read_text())["metrics"]
    assert json.loads((output_dir / "results.json").read_text())["metrics"] == full


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--trainer", "CoOOp"], "Unknown trainer 'CoOOp'"),
        (["OPTIM.LRR", "0.1"], "OPTIM.LRR"),
        (["OPTIM.LR", "1"], "OPTIM.LR"),
        (["--config-file", "configs/trainers/CoOp/missing.yaml"], "configs/trainers/CoOp/missing.yaml"),
        (["--dataset-config-file", "configs/datasets/missing.yaml"], "configs/datasets/missing.yaml"),
        (["DATASET.NAME", "OxfordPet"], "Unknown dataset 'OxfordPet'"),
        (["--root", "/nonexistent/data"], "oxford_pets"),
        (["--root", "{file}"], 'DATASET.ROOT (--root) "{file}" is a file; expected the folder that holds the datasets'),
        (["DATASET.NUM_SHOTS", "-3"], "DATASET.NUM_SHOTS must be at least -1, got -3. K >= 1 trains on K images per "
                                      "class; 0 or -1 (Dassl's default) on all training images."),
    ],
)
def test_bad_input_gives_one_clear_error(setup, tmp_path, capsys, extra, expected):
    """One paragraph, exit status 2, and nothing left in the output folder (it did not exist before)."""
    from vlprompt_app.commands import train

    (tmp_path / "a_file").write_text("")
    extra = [item.format(file=tmp_path / "a_file") for item in extra]
    assert train.run(train_argv(setup, tmp_path / "bad", *extra)) == 2
    err = capsys.readouterr().err
    assert expected.format(file=tmp_path / "a_file") in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


def test_a_full_disk_while_writing_a_checkpoint_keeps_the_last_one(setup, tmp_path, monkeypatch, capsys):
    """The write of epoch 2's checkpoint fails as on a full disk: one paragraph naming the file, the reason and
    the intact checkpoint of epoch 1, exit status 2; the same command then resumes from epoch 1."""
    import errno

    from vlprompt.utils import close_logger, load_checkpoint
    from vlprompt_app.commands import train

    fdopen = os.fdopen

    def full_disk_for_epoch_2(fd, *args, **kwargs):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".model.pth.tar-2."):
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", full_disk_for_epoch_2)
    output = tmp_path / "run"
    argv = train_argv(setup, output, "OPTIM.MAX_EPOCH", "2")
    try:
        assert train.run(argv) == 2
    finally:
        close_logger()
    folder = output / "prompt_learner"
    err = capsys.readouterr().err
    assert err == (f"\nError: Could not write {folder / 'model.pth.tar-2'}: the disk is full (No space left on "
                   "device). Nothing was damaged: the file is written to a temporary file that replaces it only when "
                   f"complete, so {folder / 'model.pth.tar-2'} was not created. Free space (or raise the limit), then "
                   f"run the same command again. The last complete checkpoint, {folder / 'model.pth.tar-1'}, is intact: the same "
                   "command resumes from it.\n")
    assert sorted(os.listdir(folder)) == ["checkpoint", "model.pth.tar-1"]
    assert load_checkpoint(str(folder / "model.pth.tar-1"))["epoch"] == 1
    monkeypatch.undo()
    try:
        assert train.run(argv) == 0
    finally:
        close_logger()
    assert "model.pth.tar-2" in os.listdir(folder) and (output / "results.json").is_file()
