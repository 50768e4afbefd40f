"""Reliability guarantees: safe loading, torn files, mid-epoch resume, bad data,
numerical faults and config faults. The kill-and-resume trials with SIGKILL are in
tests/test_kill_resume.py.
"""
import ast
import builtins
import copy
import errno
import json
import os
import os.path as osp
import pickle
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from toy_images import NUM_CLASSES, SPLIT_SIZES, ToyColourDataset, quietly, write_toy_images

from vlprompt.config import get_cfg_default
from vlprompt.data.checks import BadImagesError, DatasetContentError, check_labels
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from vlprompt.data.splits import UnsafePickleError, read_datum_pickle
from vlprompt.engine import TRAINER_REGISTRY, NonFiniteLossError, TrainerX, build_trainer
from vlprompt.engine.amp import MixedPrecision
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import (
    CheckpointError, CorruptFileError, PickledObject, atomic_write, close_logger, load_checkpoint, read_json,
    WriteFailedError, save_checkpoint, set_random_seed, write_json,
)

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- safe loading

class _RunsCodeWhenUnpickled:
    """Unpickling this object calls ``builtins.exec`` on code that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


class _CallsOsSystemWhenUnpickled:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_checkpoint_never_runs_code(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    path = tmp_path / "model.pth.tar-1"
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 1, "payload": _RunsCodeWhenUnpickled(marker)}, path)
    loaded = load_checkpoint(str(path))
    assert not marker.exists()
    assert isinstance(loaded["payload"], PickledObject) and loaded["payload"].pickled_global == "builtins.exec"
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(2))
    assert "builtins.exec" in capsys.readouterr().out

    torch.save({"state_dict": {}, "epoch": 1, "payload": _CallsOsSystemWhenUnpickled(marker)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(path))
    assert not marker.exists()
    assert f'Unable to load checkpoint from "{path}"' in str(info.value)
    assert "blocked" in str(info.value)


def test_a_malicious_fewshot_cache_is_refused(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "shot_1-seed_1.pkl"
    path.write_bytes(pickle.dumps({"train": [_RunsCodeWhenUnpickled(marker)], "val": []}))
    with pytest.raises(UnsafePickleError, match=rf"Refusing to unpickle {path}: it references builtins.exec"):
        read_datum_pickle(str(path))
    assert not marker.exists()


def test_a_dassl_checkpoint_resumes_the_scheduler_without_unpickling_it(tmp_path, capsys):
    """Dassl stores the scheduler after warm-up as an object; its fields still resume the live schedule."""
    cfg = get_cfg_default().OPTIM
    cfg.defrost()
    cfg.NAME, cfg.LR, cfg.MAX_EPOCH, cfg.LR_SCHEDULER = "sgd", 0.1, 6, "cosine"
    cfg.WARMUP_EPOCH, cfg.WARMUP_TYPE = 1, "constant"

    def build():
        model = torch.nn.Linear(2, 2)
        optimizer = build_optimizer(model, cfg)
        return optimizer, build_lr_scheduler(optimizer, cfg)

    def run(optimizer, scheduler, epochs):
        lrs = []
        for _ in range(epochs):
            optimizer.step()
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        return lrs

    uninterrupted = run(*build(), 6)
    optimizer, scheduler = build()
    first = run(optimizer, scheduler, 3)
    dassl_state = scheduler.state_dict()
    dassl_state["successor"] = copy.deepcopy(scheduler.successor)  # the object, with its own optimizer copy
    path = tmp_path / "dassl.pth.tar"
    torch.save({"state_dict": {}, "epoch": 3, "optimizer": optimizer.state_dict(), "scheduler": dassl_state}, path)

    optimizer, scheduler = build()
    checkpoint = load_checkpoint(str(path))
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    assert first + run(optimizer, scheduler, 3) == uninterrupted
    assert "inert placeholders" in capsys.readouterr().out


_UNSAFE_LOADERS_ALLOWED = {
    # The documented exception: OpenAI's TorchScript archives named by MODEL.BACKBONE.WEIGHTS
    # (or found in ~/.cache/clip), read with torch.jit.load when their SHA-256 is a published one
    # or the user trusts the file (VLPROMPT_TRUST_TORCHSCRIPT).
    ("vlprompt/clip/loading.py", "torch.jit.load"),
}


def _unsafe_loader_calls(path):
    """(dotted call, line) of every call in ``path`` that can deserialise arbitrary objects."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        keywords = {kw.arg: kw.value for kw in node.keywords}
        safe_torch_load = isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value is True
        loaders = [n.attr for n in ast.walk(keywords["Loader"]) if isinstance(n, ast.Attribute)
                   and n.attr.endswith("Loader")] if "Loader" in keywords else []
        safe_yaml_load = bool(loaders) and all(loader.endswith("SafeLoader") for loader in loaders)
        if name == "torch.load" and not safe_torch_load:
            found.append((name, node.lineno))
        elif name == "yaml.load" and not safe_yaml_load:
            found.append((name, node.lineno))
        elif name in ("pickle.load", "pickle.loads", "torch.jit.load", "yaml.unsafe_load", "dill.load"):
            found.append((name, node.lineno))
        elif name.endswith("np.load") and isinstance(keywords.get("allow_pickle"), ast.Constant) and keywords["allow_pickle"].value:
            found.append((name, node.lineno))
    return found


def _project_sources():
    """(relative path, path) of every Python file of the package, the trainers, the datasets, the tools and train.py."""
    paths = [path for folder in ("vlprompt", "trainers", "datasets", "tools") for path in sorted((ROOT / folder).rglob("*.py"))]
    return [(path.relative_to(ROOT).as_posix(), path) for path in paths + [ROOT / "train.py"]]


def test_no_code_path_deserialises_arbitrary_objects():
    """Every load in the package, the trainers, the datasets and the tools is weights-only or restricted."""
    offenders = [
        f"{relative}:{line} {name}"
        for relative, path in _project_sources()
        for name, line in _unsafe_loader_calls(path)
        if (relative, name) not in _UNSAFE_LOADERS_ALLOWED
    ]
    assert offenders == []


def test_the_loader_check_allows_yaml_load_with_a_safe_loader_only(tmp_path):
    source = tmp_path / "loads.py"
    source.write_text("yaml.load(a, Loader=yaml.CSafeLoader)\nyaml.load(b, Loader=yaml.SafeLoader)\n"
                      "yaml.load(c)\nyaml.load(d, Loader=yaml.Loader)\nyaml.load(e, Loader=LOADER)\n")
    assert _unsafe_loader_calls(source) == [("yaml.load", 3), ("yaml.load", 4), ("yaml.load", 5)]


# ---------------------------------------------------------------- a toy trainer with two models

BATCH_SIZE = 3  # 15 training images -> 5 batches per epoch


@DATASET_REGISTRY.register()
class ReliabilityToyDataset(ToyColourDataset):
    """The toy images of tests/toy_images.py: 3 classes, 5 train, 1 val, 2 test images each."""


class ToyHead(nn.Module):
    """Images [B, 3, 8, 8] -> logits [B, C] through a frozen random projection and a linear layer."""

    def __init__(self):
        super().__init__()
        self.features = nn.Linear(3 * 8 * 8, 16)
        self.features.requires_grad_(False)
        self.classifier = nn.Linear(16, NUM_CLASSES)

    def forward(self, images):
        return self.classifier(self.features(images.flatten(1)))


@TRAINER_REGISTRY.register()
class ReliabilityToyTrainer(TrainerX):
    """Two registered models ("head" and "bias", a learnable logit offset), dropout drawing from
    torch's generator in every step; ``nan_at`` (global step indices) makes those losses NaN."""

    nan_at = ()

    def build_model(self):
        self.head = ToyHead().to(self.device)
        self.bias = nn.ParameterDict({"logits": nn.Parameter(torch.zeros(NUM_CLASSES))}).to(self.device)
        for name, module in (("head", self.head), ("bias", self.bias)):
            optim = build_optimizer(module, self.cfg.OPTIM)
            self.register_model(name, module, optim, build_lr_scheduler(optim, self.cfg.OPTIM))
        self.steps_run = 0

    def model_inference(self, images):
        return self.head(images) + self.bias["logits"]

    def forward_backward(self, batch):
        images, labels = batch["img"].to(self.device), batch["label"].to(self.device)
        logits = F.dropout(self.head(images), p=0.2, training=True) + self.bias["logits"]
        ce = F.cross_entropy(logits, labels)
        step = self.epoch * self.num_batches + self.batch_idx
        reg = self.bias["logits"].pow(2).sum() * (float("nan") if step in self.nan_at else 1.0)
        loss = ce + 0.01 * reg
        self.model_backward_and_update(loss, terms={"ce": ce, "reg": reg})
        self.steps_run += 1
        if self.batch_idx + 1 == self.num_batches:
            self.update_lr()
        return {"loss": loss.item()}


class SimulatedKill(Exception):
    """Stands for the process being killed (the real SIGKILL trials are in test_kill_resume.py)."""


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    return write_toy_images(tmp_path_factory.mktemp("reliability_toy"))


def toy_cfg(root, output_dir, workers=0, checkpoint_iters=3, **overrides):
    cfg = get_cfg_default()
    cfg.SEED = 1
    cfg.USE_CUDA = False
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.DATASET.ROOT = str(root)
    cfg.DATASET.NAME = "ReliabilityToyDataset"
    cfg.INPUT.SIZE = (8, 8)
    cfg.INPUT.TRANSFORMS = ("random_resized_crop", "random_flip", "normalize")
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = BATCH_SIZE
    cfg.DATALOADER.TEST.BATCH_SIZE = 4
    cfg.OPTIM.NAME = "sgd"
    cfg.OPTIM.LR = 0.5
    cfg.OPTIM.MOMENTUM = 0.9
    cfg.OPTIM.MAX_EPOCH = 3
    cfg.OPTIM.LR_SCHEDULER = "cosine"
    cfg.OPTIM.WARMUP_EPOCH = 1
    cfg.OPTIM.WARMUP_TYPE = "linear"
    cfg.TRAIN.CHECKPOINT_ITERS = checkpoint_iters
    cfg.TRAIN.PRINT_FREQ = 100
    cfg.TRAINER.NAME = "ReliabilityToyTrainer"
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    cfg.freeze()
    return cfg


def build(cfg, nan_at=()):
    def make():
        set_random_seed(cfg.SEED)
        trainer = build_trainer(cfg)
        trainer.nan_at = nan_at
        return trainer

    return quietly(make)[0]


def kill_at_step(trainer, step):
    """Make ``trainer`` raise SimulatedKill when global step ``step`` (0-based) starts."""
    forward_backward = trainer.forward_backward

    def forward_backward_or_kill(batch):
        if trainer.epoch * trainer.num_batches + trainer.batch_idx == step:
            raise SimulatedKill
        return forward_backward(batch)

    trainer.forward_backward = forward_backward_or_kill


def final_state(trainer):
    """Everything a finished run produced: weights, optimizer and scheduler states, test metrics."""
    return {
        name: (trainer._models[name].state_dict(), trainer._optims[name].state_dict(), trainer._scheds[name].state_dict())
        for name in trainer.get_model_names()
    }, trainer.last_test["metrics"]


def assert_same_state(a, b):
    (models_a, metrics_a), (models_b, metrics_b) = a, b
    assert metrics_a == metrics_b
    for name in models_a:
        weights_a, optim_a, sched_a = models_a[name]
        weights_b, optim_b, sched_b = models_b[name]
        for key in weights_a:
            assert torch.equal(weights_a[key], weights_b[key]), (name, key)
        for param_id, state in optim_a["state"].items():
            assert torch.equal(state["momentum_buffer"], optim_b["state"][param_id]["momentum_buffer"]), name
        assert optim_a["param_groups"] == optim_b["param_groups"] and sched_a == sched_b


@pytest.fixture(scope="module")
def uninterrupted_runs(toy_root, tmp_path_factory):
    """{NUM_WORKERS: final state of an uninterrupted run}, filled on first use."""
    runs = {}

    def get(workers=0):
        if workers not in runs:
            trainer = build(toy_cfg(toy_root, tmp_path_factory.mktemp("uninterrupted"), workers=workers))
            quietly(trainer.train)
            runs[workers] = final_state(trainer)
        return runs[workers]

    return get


@pytest.fixture
def uninterrupted(uninterrupted_runs):
    return uninterrupted_runs(0)


def mid_epoch_files(output_dir, name="head"):
    return sorted(f for f in os.listdir(osp.join(output_dir, name)) if "-batch" in f)


def interrupted_run(cfg, step):
    """Train until global step ``step`` starts, as if the process were killed there (its loader
    workers end with it, as a killed process's do: the engine ends them when training raises)."""
    trainer = build(cfg)
    kill_at_step(trainer, step)
    with pytest.raises(SimulatedKill):
        quietly(trainer.train)


@pytest.mark.parametrize("kill", [True, False], ids=["raises", "ends"])
def test_training_ends_its_loader_workers_when_it_ends_or_raises(toy_root, tmp_path, kill):
    """The training loader keeps its workers between epochs; train() ends them when it returns or
    raises, since the garbage collector would end each of them only after a 5 s wait."""
    trainer = build(toy_cfg(toy_root, tmp_path, workers=2, **{"OPTIM.MAX_EPOCH": 1, "TEST.NO_TEST": True}))
    workers = []
    forward_backward = trainer.forward_backward

    def forward_backward_seeing_the_workers(batch):
        workers.extend(trainer.train_loader_x._iterator._workers)
        return forward_backward(batch)

    trainer.forward_backward = forward_backward_seeing_the_workers
    if kill:
        kill_at_step(trainer, 2)
        with pytest.raises(SimulatedKill):
            quietly(trainer.train)
    else:
        quietly(trainer.train)
    assert len(set(workers)) == 2
    assert trainer.train_loader_x._iterator is None and not any(worker.is_alive() for worker in workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_a_mid_epoch_checkpoint_is_bit_identical(toy_root, tmp_path, uninterrupted_runs, workers):
    """Sampler position, RNG states (the loader workers' through per-item seeds), optimizer and
    scheduler are restored: the resumed run ends with the uninterrupted run's exact state."""
    cfg = toy_cfg(toy_root, tmp_path, workers=workers)
    interrupted_run(cfg, step=11)  # checkpoints after steps 3, 6, 9 (global); the last two are kept
    assert mid_epoch_files(tmp_path) == ["model.pth.tar-1-batch1", "model.pth.tar-1-batch4"]
    assert mid_epoch_files(tmp_path, "bias") == ["model.pth.tar-1-batch1", "model.pth.tar-1-batch4"]

    resumed = build(cfg)
    _, lines = quietly(resumed.train)
    assert "** Training resumes in epoch 2/3 after batch 4 (weights, optimizer, scheduler, RNG states and " \
           "data order restored)." in lines
    assert resumed.steps_run == 15 - 9
    assert_same_state(final_state(resumed), uninterrupted_runs(workers))
    assert mid_epoch_files(tmp_path) == []  # superseded by the final model.pth.tar-3
    assert sorted(os.listdir(tmp_path / "head")) == ["checkpoint", "model.pth.tar-3"]


def _with_gradient_scaler(trainer):
    """Give ``trainer`` a CPU GradScaler whose scale doubles every 2 steps, so that its state changes as it trains."""
    trainer.amp.scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=2)
    return trainer


def test_resume_restores_the_gradient_scaler(toy_root, tmp_path):
    reference = _with_gradient_scaler(build(toy_cfg(toy_root, tmp_path / "uninterrupted")))
    quietly(reference.train)
    cfg = toy_cfg(toy_root, tmp_path / "killed")
    killed = _with_gradient_scaler(build(cfg))
    kill_at_step(killed, 11)
    with pytest.raises(SimulatedKill):
        quietly(killed.train)

    resumed = _with_gradient_scaler(build(cfg))
    quietly(resumed.train)
    assert reference.amp.scaler.get_scale() == 16.0 * 2 ** (15 // 2)  # 15 steps: the scale grew 7 times
    assert resumed.amp.state_dict() == reference.amp.state_dict()
    assert_same_state(final_state(resumed), final_state(reference))


def test_a_corrupt_newest_checkpoint_is_skipped_with_its_name(toy_root, tmp_path, uninterrupted):
    cfg = toy_cfg(toy_root, tmp_path)
    interrupted_run(cfg, step=11)
    newest = tmp_path / "bias" / "model.pth.tar-1-batch4"
    newest.write_bytes(newest.read_bytes()[:100])  # e.g. damaged by a copy
    resumed = build(cfg)
    _, lines = quietly(resumed.train)
    skipped = [line for line in lines if line.startswith("Skipping a checkpoint")]
    assert len(skipped) == 1 and f'"{newest}"' in skipped[0] and "truncated or corrupt" in skipped[0]
    assert "** Training resumes in epoch 2/3 after batch 1 (weights, optimizer, scheduler, RNG states and " \
           "data order restored)." in lines
    assert_same_state(final_state(resumed), uninterrupted)


def test_a_save_interrupted_between_models_falls_back_to_a_complete_position(toy_root, tmp_path, uninterrupted):
    cfg = toy_cfg(toy_root, tmp_path)
    interrupted_run(cfg, step=11)
    # As if killed while writing "bias" after "head": bias has only the hidden temporary file.
    (tmp_path / "bias" / "model.pth.tar-1-batch4").rename(tmp_path / "bias" / ".model.pth.tar-1-batch4.x1y2.tmp")
    resumed = build(cfg)
    _, lines = quietly(resumed.train)
    assert f'Removed 1 temporary file(s) left in "{tmp_path / "bias"}" by an interrupted save' in lines
    assert ("Note: ignoring checkpoints that exist for only some of the models (a save was interrupted): "
            "1 epoch(s) + 4 batch(es)") in lines
    assert "** Training resumes in epoch 2/3 after batch 1 (weights, optimizer, scheduler, RNG states and " \
           "data order restored)." in lines
    assert_same_state(final_state(resumed), uninterrupted)


def test_no_usable_checkpoint_is_an_error_naming_each_file(toy_root, tmp_path):
    cfg = toy_cfg(toy_root, tmp_path)
    interrupted_run(cfg, step=5)  # one checkpoint: after step 3
    for name in ("head", "bias"):
        (tmp_path / name / "model.pth.tar-0-batch3").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError) as info:
        quietly(build(cfg).train)
    message = str(info.value)
    assert message.startswith(f'None of the checkpoints in "{tmp_path}" can be used:')
    assert str(tmp_path / "head" / "model.pth.tar-0-batch3") in message


# ---------------------------------------------------------------- numerical faults

def test_a_nan_loss_stops_the_run_with_the_step_the_terms_and_the_last_checkpoint(toy_root, tmp_path):
    trainer = build(toy_cfg(toy_root, tmp_path), nan_at={7})  # epoch 2, batch 3; a checkpoint after step 6
    with pytest.raises(NonFiniteLossError) as info:
        quietly(trainer.train)
    message = str(info.value)
    assert message.startswith("Loss is infinite or NaN! At epoch 2/3, batch 3/5: loss = nan (ce = ")
    assert "reg = nan)." in message
    last = tmp_path / "head" / "model.pth.tar-1-batch1"
    assert f'The last good checkpoint is kept: "{last}" with the same file of every other model.' in message
    assert all(torch.isfinite(p).all() for p in trainer.head.parameters())  # the NaN step changed nothing
    assert mid_epoch_files(tmp_path) == ["model.pth.tar-0-batch3", "model.pth.tar-1-batch1"]
    assert load_checkpoint(str(last))["epoch"] == 1


def test_nonfinite_steps_can_be_skipped_and_are_counted_in_results(toy_root, tmp_path):
    trainer = build(toy_cfg(toy_root, tmp_path, **{"TRAIN.NONFINITE_LOSS": "skip"}), nan_at={2, 11})
    _, lines = quietly(trainer.train)
    skipped = [line for line in lines if line.startswith("Skipping a step with a non-finite loss")]
    assert [line.split(": ", 1)[1].split(": loss")[0] for line in skipped] == [
        "At epoch 1/3, batch 3/5", "At epoch 3/3, batch 2/5"
    ]
    assert all(torch.isfinite(p).all() for p in trainer.bias.parameters())
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["skipped_nonfinite_steps"] == 2 and results["completed"]


def test_a_skipped_step_lowers_the_gradient_scale_like_an_overflow():
    amp = MixedPrecision("fp32", torch.device("cpu"))
    amp.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    amp.skip_step()  # before the scaler scaled any loss
    assert amp.scaler.get_scale() == 512.0
    amp.skip_step()
    assert amp.scaler.get_scale() == 256.0


# ---------------------------------------------------------------- bad data

def _truncate(path):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


@pytest.fixture
def damaged_root(toy_root, tmp_path):
    """A copy of the toy images with one truncated training JPEG and one non-image test file."""
    root = tmp_path / "data"
    shutil.copytree(toy_root, root)
    _truncate(root / "c1" / "train2.jpg")
    (root / "c2" / "test0.jpg").write_bytes(b"<html>404 Not Found</html>")
    return root


def test_unreadable_images_stop_the_run_before_training_with_their_paths(damaged_root, tmp_path):
    output = tmp_path / "run"
    trainer = build(toy_cfg(damaged_root, output))
    with pytest.raises(BadImagesError) as info:
        quietly(trainer.train)
    message = str(info.value)
    assert message.startswith("2 image file(s) used by this run cannot be read (train: 1, test: 1); nothing was trained.")
    assert str(damaged_root / "c1" / "train2.jpg") in message and str(damaged_root / "c2" / "test0.jpg") in message
    assert "DATASET.SKIP_BAD_IMAGES True" in message
    assert trainer.steps_run == 0 and not (output / "head").exists()
    report = (output / "bad_images.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in report) == [
        str(damaged_root / "c1" / "train2.jpg"), str(damaged_root / "c2" / "test0.jpg")
    ]


def test_unreadable_images_can_be_skipped_and_are_counted_in_results(damaged_root, tmp_path):
    trainer = build(toy_cfg(damaged_root, tmp_path, **{"DATASET.SKIP_BAD_IMAGES": True}))
    _, lines = quietly(trainer.train)
    assert any(line.startswith("Left out 2 unreadable image(s) (DATASET.SKIP_BAD_IMAGES; train: 1, test: 1)")
               for line in lines)
    assert len(trainer.dm.dataset.train_x) == 14 and trainer.steps_run == 3 * 4  # 14 images: 4 batches of 3
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["skipped_images"] == {"train": 1, "val": 0, "test": 1}
    assert results["num_test"] == NUM_CLASSES * SPLIT_SIZES["test"] - 1


def test_eval_only_checks_the_evaluated_split(damaged_root, tmp_path):
    trainer = build(toy_cfg(damaged_root, tmp_path))
    with pytest.raises(BadImagesError, match=r"\(test: 1\)"):  # the truncated training image is not read
        quietly(trainer.test)


def test_a_run_evaluating_its_val_split_does_not_read_the_test_images(damaged_root, tmp_path):
    """TEST.SPLIT val with a val split: the broken test file is never read, so only the training
    image is left out before training."""
    trainer = build(toy_cfg(damaged_root, tmp_path, **{"TEST.SPLIT": "val", "DATASET.SKIP_BAD_IMAGES": True}))
    _, lines = quietly(trainer.train)
    assert any(line.startswith("Left out 1 unreadable image(s) (DATASET.SKIP_BAD_IMAGES; train: 1)") for line in lines)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["skipped_images"] == {"train": 1, "val": 0, "test": 0} and results["split"] == "val"
    quietly(lambda: trainer.test("test"))  # checked when it is evaluated
    assert trainer.skipped_images["test"] == 1


def _dataset(train, val=(), test=()):
    def items(records):
        return [Datum.unchecked(f"/data/{i}.jpg", label, 0, name) for i, (label, name) in enumerate(records)]

    return DatasetBase(train_x=items(train), val=items(val), test=items(test))


@pytest.mark.parametrize(
    "train, test, expected",
    [
        ([(0, "cat"), (2, "dog")], [(0, "cat")], "label(s) [1] have no training image"),
        ([(0, "cat"), (1, "dog")], [(2, "cow")], "has label 2 (cow), which no training item has"),
        ([(0, "cat"), (1, "dog")], [(1, "cow")], 'label 1 is "dog" in train_x but "cow" in test'),
        ([(-1, "cat"), (0, "dog")], [], "training labels must be integers >= 0"),
    ],
)
def test_inconsistent_labels_are_a_clear_error(train, test, expected):
    with pytest.raises(DatasetContentError) as info:
        check_labels(_dataset(train, test=test))
    assert expected in str(info.value)
    assert str(info.value).startswith("Dataset DatasetBase has inconsistent labels: ")
    check_labels(_dataset([(0, "cat"), (1, "dog")], test=[(1, "dog")]))


@pytest.fixture
def pets_root(tmp_path):
    from vlprompt.testing import write_oxford_pets_tree

    write_oxford_pets_tree(str(tmp_path / "pets"), train=3, val=1, test=1)
    return tmp_path / "pets"


def _pets_cfg(root, shots=1):
    cfg = get_cfg_default()
    cfg.DATASET.ROOT, cfg.DATASET.NAME, cfg.DATASET.NUM_SHOTS, cfg.SEED = str(root), "OxfordPets", shots, 1
    return cfg


def test_a_fewshot_cache_that_does_not_match_the_split_is_an_error(pets_root):
    import datasets  # noqa: F401  (registers OxfordPets)
    from vlprompt.data.datasets import build_dataset

    quietly(lambda: build_dataset(_pets_cfg(pets_root)))  # samples and caches 1 shot per class
    split_path = pets_root / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(split_path.read_text())
    split["train"] = [[path, label, name + "_renamed"] for path, label, name in split["train"]]
    split_path.write_text(json.dumps(split))
    with pytest.raises(DatasetContentError) as info:
        quietly(lambda: build_dataset(_pets_cfg(pets_root)))
    message = str(info.value)
    assert "shot_1-seed_1.* does not match the current split: 5 of its 5 train items" in message
    assert "delete the cache to sample again" in message


def test_a_split_file_listing_missing_images_is_an_error_naming_them(pets_root):
    import datasets  # noqa: F401
    from vlprompt.data.datasets import MissingImagesError, build_dataset

    missing = pets_root / "oxford_pets" / "images" / "Bengal_2.jpg"
    missing.unlink()
    with pytest.raises(MissingImagesError) as info:
        quietly(lambda: build_dataset(_pets_cfg(pets_root)))
    assert str(missing) in str(info.value) and "split_zhou_OxfordPets.json" in str(info.value)


@pytest.mark.parametrize("torn", ["split_zhou_OxfordPets.json", "split_fewshot/shot_1-seed_1.json"])
def test_a_torn_json_file_is_never_used_and_named(pets_root, torn):
    import datasets  # noqa: F401
    from vlprompt.data.datasets import build_dataset

    quietly(lambda: build_dataset(_pets_cfg(pets_root)))
    path = pets_root / "oxford_pets" / torn
    _truncate(path)
    with pytest.raises(CorruptFileError) as info:
        quietly(lambda: build_dataset(_pets_cfg(pets_root)))
    assert str(info.value).startswith(f'"{path}" is not valid JSON (')


def _writers(tmp_path):
    """(name, write(version) -> path) for every file kind a run writes and later reads."""
    from vlprompt.data.splits import save_fewshot_cache, save_split
    from vlprompt.engine.run_folder import RunFolder

    prefix = str(tmp_path / "images")

    def items(version):
        return [Datum.unchecked(osp.join(prefix, f"{version}_{i}.jpg"), i, 0, f"class{i}") for i in range(3)]

    return [
        ("split file", lambda v: save_split(items(v), items(v), items(v), str(tmp_path / "split.json"), prefix)
         or tmp_path / "split.json"),
        ("few-shot cache", lambda v: save_fewshot_cache(str(tmp_path), 1, 1, {"train": items(v), "val": items(v)})),
        ("results file", lambda v: RunFolder(tmp_path).write_results({"metrics": {"accuracy": v}})),
        ("checkpoint", lambda v: save_checkpoint({"state_dict": {"w": torch.full((4,), float(v))}, "epoch": 1},
                                                 str(tmp_path / "model"))),
        *_tool_writers(tmp_path),
    ]


def _toy_discovery(version):
    """A RoleDiscovery of one 4-head layer whose numbers depend on ``version``."""
    from vlprompt.clip.head_roles import parse_role_map
    from vlprompt.interpret.concepts import ConceptSpace
    from vlprompt.interpret.discovery import HeadSummary, RoleDiscovery

    role_map = parse_role_map({"num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
                               "roles": {3: ["A color", "A shape", "G", "M"]}})
    concepts = ConceptSpace(names=("color", "shape"), centroids=torch.eye(2), members=(("red",), ("round",)))
    heads = [
        HeadSummary(layer=3, head=head, phrases=["red", "round"], explained=[0.5, 0.25], phrase_concepts=["color", "shape"],
                    distribution={"color": 0.5, "shape": 0.5}, entropy=0.1 * version, weighted_entropy=0.2 * version,
                    dominant="color", role=role)
        for head, role in enumerate(role_map.roles[3])
    ]
    role_map.notes = f"version {version}"
    return RoleDiscovery(heads=heads, concepts=concepts, role_map=role_map, settings={"version": version})


def _tool_writers(tmp_path):
    """(name, write(version) -> path) for the files the tools write: head-role map and reports, tables, plots."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlprompt.interpret import write_csv, write_heatmap, write_markdown
    from vlprompt.utils import save_figure

    from vlprompt_app.commands import head_roles
    from vlprompt_app import results

    def role_map(version):
        path = tmp_path / "roles" / "head_roles.yaml"
        _toy_discovery(version).role_map.save(str(path))
        return path

    def report(write, name):
        def run(version):
            write(_toy_discovery(version), str(tmp_path / name))
            return tmp_path / name
        return run

    def tool_outputs(version):
        head_roles.write_outputs(_toy_discovery(version), str(tmp_path / "tool"), heatmap=False)
        return tmp_path / "tool" / "head_roles.yaml"

    def plot(version):
        figure, axis = plt.subplots(figsize=(2, 2))
        axis.plot([0, 1], [0, version])
        save_figure(figure, str(tmp_path / "plot.png"), dpi=50)
        plt.close(figure)
        return tmp_path / "plot.png"

    def table_json(version):
        results.write_json({"accuracy": version}, str(tmp_path / "tables" / "results.json"))
        return tmp_path / "tables" / "results.json"

    return [
        ("head-role map", role_map),
        ("head-role report", report(write_markdown, "report.md")),
        ("head-role csv", report(write_csv, "heads.csv")),
        ("head-role heat map", report(write_heatmap, "heatmap.png")),
        ("tools/head_roles.py outputs", tool_outputs),
        ("plot", plot),
        ("parse_results json", table_json),
    ]


class _DiskFullFile:
    """Wraps a file: its first write stores half of the data, then fails like a full disk."""

    def __init__(self, file):
        self._file = file

    def write(self, data):
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._file.close()


WRITTEN_FILE_KINDS = [
    "split file", "few-shot cache", "results file", "checkpoint", "head-role map", "head-role report",
    "head-role csv", "head-role heat map", "tools/head_roles.py outputs", "plot", "parse_results json",
]


def test_every_writer_is_in_the_parametrised_kinds(tmp_path):
    """A writer added to _writers but not to WRITTEN_FILE_KINDS would never be tested."""
    assert [name for name, _ in _writers(tmp_path)] == WRITTEN_FILE_KINDS


@pytest.mark.parametrize("kind", WRITTEN_FILE_KINDS)
def test_a_write_that_fails_midway_keeps_the_previous_file(tmp_path, monkeypatch, kind):
    """Each file kind, rewritten while the disk fills up in the middle of the write, keeps its old bytes."""
    write = dict(_writers(tmp_path))[kind]
    path = Path(quietly(lambda: write(1))[0])
    before = path.read_bytes()
    fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: _DiskFullFile(fdopen(*args, **kwargs)))
    with pytest.raises(WriteFailedError, match=rf"^Could not write {re.escape(str(path))}: the disk is full \(No space "
                                               rf"left on device\)\. Nothing was damaged: .* so {re.escape(str(path))} "
                                               "keeps its previous content"):
        quietly(lambda: write(2))
    assert path.read_bytes() == before
    assert [name for name in os.listdir(path.parent) if name.endswith(".tmp")] == []
    monkeypatch.undo()
    quietly(lambda: write(2))
    assert path.read_bytes() != before  # the new version differs, so a torn or replaced file would have shown


_RAW_WRITES_ALLOWED = {  # (file, start of the call's source)
    # Logs, written line by line while a run goes on (a torn last line is expected after a kill).
    ("vlprompt/utils/logger.py", "open(fpath, 'w', encoding='utf-8')"),
    ("vlprompt_app/protocols/execute.py", "open(console_path, 'a', encoding='utf-8')"),
    # The test-time episode log: one fixed-size record appended and fsynced per adapted image; a
    # torn last record after a kill is cut off on reading (r+b truncates it before appending).
    ("vlprompt/engine/test_time.py", "open(self.path, 'r+b')"),
    ("vlprompt/engine/test_time.py", "open(self.path, 'ab')"),
    # Benchmark scratch files, rewritten by every benchmark run: the loader benchmark's synthetic
    # split and the CoCoOp benchmark's logits (compared between its two processes).
    ("vlprompt_app/benchmarking/loader.py", "open(split_path, 'w')"),
    ("vlprompt_app/benchmarking/loader.py", "json.dump({'train': train, 'val': train[:1], 'test': train[:1]}, f)"),
    ("vlprompt_app/benchmarking/cocoop.py", "torch.save(output, job['logits'])"),
    # A kernel control file, not data: resets the peak-memory counter.
    ("vlprompt_app/benchmarking/measure.py", "open('/proc/self/clear_refs', 'w')"),
}
_SERIALISERS = {"torch.save": 1, "json.dump": 1, "pickle.dump": 1, "yaml.safe_dump": 1, "yaml.dump": 1, "np.save": 0}


def _raw_file_writes(path):
    """(call source, line) of every write in ``path`` that does not go through ``atomic_write``.

    A write is ``open`` with a "w", "a", "x" or "+" mode, ``Path.write_text``/``write_bytes``,
    or a serialiser (torch.save, json.dump, ..., ``.savefig``) whose target is not the file
    object of an enclosing ``with atomic_write(...) as f``.
    """
    found = []

    def target_is_atomic(target, atomic_files):
        return isinstance(target, ast.Name) and target.id in atomic_files

    def visit(node, atomic_files):
        if isinstance(node, ast.With):
            atomic_files = atomic_files | {
                item.optional_vars.id for item in node.items
                if isinstance(item.context_expr, ast.Call) and ast.unparse(item.context_expr.func).endswith("atomic_write")
                and isinstance(item.optional_vars, ast.Name)
            }
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            keywords = {kw.arg: kw.value for kw in node.keywords}
            if name == "open":
                mode = node.args[1] if len(node.args) > 1 else keywords.get("mode")
                if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
                    found.append((ast.unparse(node), node.lineno))
            elif name.endswith((".write_text", ".write_bytes")):
                found.append((ast.unparse(node), node.lineno))
            elif name in _SERIALISERS or name.endswith(".savefig"):
                position = 0 if name.endswith(".savefig") else _SERIALISERS[name]
                target = node.args[position] if len(node.args) > position else keywords.get("f", keywords.get("fname"))
                if target is not None and not target_is_atomic(target, atomic_files):  # None: dumps to a string
                    found.append((ast.unparse(node), node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, atomic_files)

    visit(ast.parse(path.read_text(encoding="utf-8")), frozenset())
    return found


def test_every_file_the_code_writes_goes_through_atomic_write():
    """Results, reports, role maps, tables, plots, caches and checkpoints: temporary file, fsync, os.replace."""
    offenders = [
        f"{relative}:{line} {call}"
        for relative, path in _project_sources()
        for call, line in _raw_file_writes(path)
        if not any(relative == allowed_file and call.startswith(allowed_call)
                   for allowed_file, allowed_call in _RAW_WRITES_ALLOWED)
    ]
    assert offenders == []


def test_the_write_scanner_finds_raw_writes(tmp_path):
    source = tmp_path / "writer.py"
    source.write_text(
        "with open(p, 'w') as f:\n    json.dump(x, f)\n"
        "with atomic_write(p, 'wb') as f:\n    torch.save(x, f)\n"
        "torch.save(x, p)\nfigure.savefig(p)\nPath(p).write_text('x')\nopen(p).read()\n"
    )
    assert _raw_file_writes(source) == [
        ("open(p, 'w')", 1), ("json.dump(x, f)", 2), ("torch.save(x, p)", 5), ("figure.savefig(p)", 6),
        ("Path(p).write_text('x')", 7),
    ]


def test_a_write_killed_midway_leaves_the_previous_file(tmp_path):
    """SIGKILL inside atomic_write: the final name keeps the old content, never a torn file."""
    path = tmp_path / "results.json"
    write_json({"accuracy": 50.0}, str(path))
    child = os.fork()
    if child == 0:  # the child writes half of the new file, then is killed
        with atomic_write(str(path), "w") as f:
            f.write('{"accuracy": 9')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert read_json(str(path)) == {"accuracy": 50.0}
    leftovers = [name for name in os.listdir(tmp_path) if name != "results.json"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".results.json.") and leftovers[0].endswith(".tmp")


def test_the_readme_reliability_section_names_real_keys_values_and_tests():
    """Every config key the README's reliability section cites exists, its values are accepted, and its test files exist."""
    from vlprompt.engine.config_checks import NONFINITE_LOSS_CHOICES
    from vlprompt.data.checks import IMAGE_CHECKS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Reliability\n", 1)[1].split("\n## ", 1)[0]
    cited = dict(re.findall(r"`((?:[A-Z_]+\.)+[A-Z_]+)(?: ([^`]*))?`", section))
    assert {"TRAIN.CHECKPOINT_ITERS", "DATASET.CHECK_IMAGES", "DATASET.SKIP_BAD_IMAGES", "TRAIN.NONFINITE_LOSS"} <= set(cited)
    cfg = get_cfg_default()
    for key in cited:
        node = cfg
        for part in key.split("."):
            assert part in node, f"README cites {key}, which the config does not have"
            node = node[part]
    assert set(cited["DATASET.CHECK_IMAGES"].split("|")) == set(IMAGE_CHECKS)
    assert cited["TRAIN.NONFINITE_LOSS"] in NONFINITE_LOSS_CHOICES
    assert cited["DATASET.SKIP_BAD_IMAGES"] == "True" and isinstance(cfg.DATASET.SKIP_BAD_IMAGES, bool)
    for test_file in re.findall(r"`(tests/[\w/]+\.py)`", section):
        assert (ROOT / test_file).is_file(), test_file


# ---------------------------------------------------------------- config faults

def _cli_argv(clip_files, output_dir, *extra):
    """train.py arguments for CoOp on a dataset root that does not exist: anything that gets as far as
    reading data fails with the dataset's layout error, so a config error proves it came first."""
    config, weights = clip_files
    flags, opts = [], []
    items = list(extra)
    while items:
        item = items.pop(0)
        if item == "--eval-only":
            flags.append(item)
        elif item.startswith("--"):
            flags += [item, items.pop(0)]
        else:
            opts += [item, items.pop(0)]
    return [
        "--root", "/nonexistent/data", "--trainer", "CoOp", "--seed", "1", "--output-dir", str(output_dir),
        "--dataset-config-file", str(ROOT / "configs/datasets/oxford_pets.yaml"),
        "--config-file", str(ROOT / "configs/trainers/CoOp/toy.yaml"), *flags,
        "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, *opts,
    ]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["DATALOADER.TRAIN_X.BATCH_SIZE", "0"], "DATALOADER.TRAIN_X.BATCH_SIZE must be at least 1, got 0."),
        (["DATALOADER.TEST.BATCH_SIZE", "-4"], "DATALOADER.TEST.BATCH_SIZE must be at least 1, got -4."),
        (["TRAIN.PRINT_FREQ", "0"], "TRAIN.PRINT_FREQ must be at least 1, got 0."),
        (["INPUT.SIZE", "(32,)"], "INPUT.SIZE must be two positive integers (height, width), got (32,)."),
        (["OPTIM.NAME", "adamm"], "OPTIM.NAME must be one of ['adam', 'amsgrad', 'sgd', 'rmsprop', 'radam', 'adamw']"),
        (["DATASET.SUBSAMPLE_CLASSES", "novel"], "DATASET.SUBSAMPLE_CLASSES must be one of ['all', 'base', 'new']"),
        (["DATASET.SUBSAMPLE_CLASSES", "new"], "DATASET.SUBSAMPLE_CLASSES new selects the novel classes"),
        (["TEST.FINAL_MODEL", "best_val", "TEST.NO_TEST", "True"], "TEST.NO_TEST True turns evaluation off"),
        (["TRAIN.NONFINITE_LOSS", "ignore"], "TRAIN.NONFINITE_LOSS must be one of ['stop', 'skip'], got 'ignore'."),
        (["DATASET.CHECK_IMAGES", "full"], "DATASET.CHECK_IMAGES must be one of ['verify', 'decode', 'off']"),
        (["INPUT.TRANSFORMS", "['randaugment']"], "INPUT.TRANSFORMS asks for ['randaugment']"),
        (["--resume", "/nonexistent/run"], 'RESUME (--resume) is "/nonexistent/run", which is not an existing folder.'),
        (["--trainer", "MaPLe", "TRAINER.MAPLE.PROMPT_DEPTH", "9"],
         "TRAINER.MAPLE.PROMPT_DEPTH must be between 1 and 2, got 9. The text tower of"),
    ],
)
def test_config_faults_are_rejected_before_any_data_is_read(tiny_clip_files, tmp_path, capsys, extra, expected):
    from vlprompt_app.commands import train

    assert train.run(_cli_argv(tiny_clip_files, tmp_path / "run", *extra)) == 2
    error = capsys.readouterr().err
    assert expected in error and "oxford_pets" not in error
    assert "Traceback" not in error


def test_novel_classes_may_be_evaluated(tiny_clip_files, tmp_path, capsys):
    from vlprompt_app.commands import train

    argv = _cli_argv(tiny_clip_files, tmp_path / "run", "--eval-only", "DATASET.SUBSAMPLE_CLASSES", "new")
    try:
        assert train.run(argv) == 2
    finally:
        close_logger()
    assert "Dataset OxfordPets: no folder" in capsys.readouterr().err  # the config passed; the data is missing


def test_a_diverging_run_exits_3_and_logs_the_step(tiny_clip_files, pets_root, tmp_path):
    from vlprompt_app.commands import train

    argv = _cli_argv(tiny_clip_files, tmp_path / "run", "--root", str(pets_root), "DATASET.NUM_SHOTS", "2",
                     "OPTIM.LR", "1e30", "OPTIM.WARMUP_EPOCH", "-1")
    def run():
        try:
            return train.run(argv)
        finally:
            close_logger()  # what the process exit does: flush and close log.txt

    assert quietly(run)[0] == 3
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "Error: Loss is infinite or NaN! At epoch 1/3, batch " in log
    assert "No checkpoint has been written yet" in log
    assert not (tmp_path / "run" / "results.json").exists()
