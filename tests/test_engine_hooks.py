"""Tests of the engine's hooks (vlprompt/engine/hooks.py): the order in which the lifecycle calls
them, their place relative to the default hooks and to a trainer's own overrides, and how a
hook's exception surfaces.

A registered TrainerX subclass (a linear head on the toy images of tests/toy_images.py, 15
training images in batches of 5 -> 3 batches per epoch) trains 2 epochs on the CPU.
"""
import os
import os.path as osp
import traceback

import pytest
from torch import nn
from torch.nn import functional as F
from toy_images import ToyColourDataset, quietly, write_toy_images

from vlprompt.config import get_cfg_default
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.engine import TRAINER_REGISTRY, HookBase, TrainerBase, TrainerX, build_trainer
from vlprompt.engine.hooks import HOOK_STAGES, call_hooks
from vlprompt.optim import build_lr_scheduler, build_optimizer

EPOCHS = 2
BATCHES = 3  # 15 training images, batch size 5


@DATASET_REGISTRY.register()
class HookToyDataset(ToyColourDataset):
    """The toy images: 3 classes (train 5, val 1, test 2 per class)."""


@TRAINER_REGISTRY.register()
class HookToyTrainer(TrainerX):
    """A linear head on flattened 8x8 images, registered as "head"."""

    def build_model(self):
        self.model = nn.Linear(3 * 8 * 8, self.num_classes).to(self.device)
        optim = build_optimizer(self.model, self.cfg.OPTIM)
        self.register_model("head", self.model, optim, build_lr_scheduler(optim, self.cfg.OPTIM))

    def parse_batch_train(self, batch):
        return batch["img"].flatten(1), batch["label"]

    def parse_batch_test(self, batch):
        return batch["img"].flatten(1), batch["label"]

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        loss = F.cross_entropy(self.model(images), labels)
        self.model_backward_and_update(loss)
        if (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return {"loss": loss.item()}


@TRAINER_REGISTRY.register()
class HookToyTrainerOwnEpochEnd(HookToyTrainer):
    """Overrides after_epoch without super(): Dassl semantics, the hooks' after_epoch does not run."""

    def after_epoch(self):
        self.own_epoch_ends = getattr(self, "own_epoch_ends", 0) + 1


@TRAINER_REGISTRY.register()
class HookToyTrainerRecorded(HookToyTrainer):
    """Adds a Recorder to the default hooks through build_hooks (the pattern of the README)."""

    def build_hooks(self):
        self.recorder = Recorder()
        return super().build_hooks() + [self.recorder]


class Recorder(HookBase):
    """Records (stage, epoch, batch) of every call, and what the trainer looked like then."""

    def __init__(self):
        self.calls = []
        self.checkpoints_at_epoch_end = []

    def before_train(self, trainer):
        self.calls.append(("before_train", trainer.start_epoch, None))

    def before_epoch(self, trainer):
        self.calls.append(("before_epoch", trainer.epoch, None))

    def after_step(self, trainer):
        self.calls.append(("after_step", trainer.epoch, trainer.batch_idx))

    def after_epoch(self, trainer):
        self.calls.append(("after_epoch", trainer.epoch, None))
        folder = osp.join(trainer.output_dir, "head")
        self.checkpoints_at_epoch_end.append(sorted(n for n in _listdir(folder) if n.startswith("model")))

    def after_train(self, trainer):
        self.calls.append(("after_train", trainer.epoch, None))


class Failing(HookBase):
    def after_epoch(self, trainer):
        raise ValueError(f"cannot handle epoch {trainer.epoch}")


def _listdir(folder):
    return os.listdir(folder) if osp.isdir(folder) else []


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return str(write_toy_images(tmp_path_factory.mktemp("hook_toy_data")))


def make_trainer(data_root, output_dir, name="HookToyTrainer", checkpoint_freq=1):
    cfg = get_cfg_default()
    cfg.SEED = 1
    cfg.USE_CUDA = False
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.DATASET.ROOT = data_root
    cfg.DATASET.NAME = "HookToyDataset"
    cfg.INPUT.SIZE = (8, 8)
    cfg.INPUT.TRANSFORMS = ("normalize",)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = 5
    cfg.OPTIM.NAME = "sgd"
    cfg.OPTIM.LR = 0.1
    cfg.OPTIM.MAX_EPOCH = EPOCHS
    cfg.TRAIN.CHECKPOINT_FREQ = checkpoint_freq
    cfg.TRAINER.NAME = name
    cfg.freeze()
    return quietly(lambda: build_trainer(cfg))[0]


def test_hooks_are_called_in_lifecycle_order_after_the_default_hooks(data_root, tmp_path):
    trainer = make_trainer(data_root, tmp_path)
    recorder = Recorder()
    trainer.register_hooks([recorder])
    _, lines = quietly(trainer.train)

    expected = [("before_train", 0, None)]
    for epoch in range(EPOCHS):
        expected.append(("before_epoch", epoch, None))
        expected += [("after_step", epoch, batch) for batch in range(BATCHES)]
        expected.append(("after_epoch", epoch, None))
    expected.append(("after_train", EPOCHS - 1, None))
    assert recorder.calls == expected
    # The default CheckpointHook runs before a hook registered later: the epoch's file exists.
    assert recorder.checkpoints_at_epoch_end == [["model.pth.tar-1"], ["model.pth.tar-1", "model.pth.tar-2"]]
    # SimpleTrainer prints "Finish training" before the hooks, the LoggingHook ends the log.
    assert lines.index("Finish training") < lines.index("Evaluate on the *test* set")
    assert lines[-1].startswith("Elapsed: ")


def test_a_resumed_finished_run_calls_only_the_train_hooks(data_root, tmp_path):
    quietly(make_trainer(data_root, tmp_path).train)
    trainer = make_trainer(data_root, tmp_path, name="HookToyTrainerRecorded")
    assert [type(hook).__name__ for hook in trainer.hooks] == [
        "CheckpointHook", "FinalEvaluationHook", "LoggingHook", "Recorder"]
    quietly(trainer.train)
    recorder = trainer.recorder
    assert [stage for stage, _, _ in recorder.calls] == ["before_train", "after_train"]
    assert recorder.calls[0] == ("before_train", EPOCHS, None)  # CheckpointHook resumed before it


def test_a_hooks_exception_keeps_its_type_and_names_the_hook_and_stage(data_root, tmp_path):
    trainer = make_trainer(data_root, tmp_path)
    trainer.register_hooks([Failing()])
    with pytest.raises(ValueError, match="cannot handle epoch 0") as excinfo:
        quietly(trainer.train)
    assert excinfo.value.__notes__ == ["raised by hook Failing.after_epoch"]
    assert "raised by hook Failing.after_epoch" in "".join(traceback.format_exception(excinfo.value))
    # The hooks before it ran: the epoch checkpoint was written.
    assert osp.isfile(osp.join(str(tmp_path), "head", "model.pth.tar-1"))


def test_overriding_a_lifecycle_method_without_super_replaces_the_hooks(data_root, tmp_path):
    trainer = make_trainer(data_root, tmp_path, name="HookToyTrainerOwnEpochEnd")
    recorder = Recorder()
    trainer.register_hooks([recorder])
    quietly(trainer.train)
    assert trainer.own_epoch_ends == EPOCHS
    assert "after_epoch" not in [stage for stage, _, _ in recorder.calls]
    assert _listdir(osp.join(str(tmp_path), "head")) == []  # no epoch-end checkpoint (Dassl semantics)


def test_register_hooks_rejects_other_objects_and_call_hooks_unknown_stages():
    trainer = TrainerBase()
    with pytest.raises(TypeError, match="HookBase subclass, got function"):
        trainer.register_hooks([lambda trainer: None])
    with pytest.raises(ValueError, match="after_batch.*before_train"):
        call_hooks([HookBase()], "after_batch", trainer)
    assert trainer.hooks == []
    for stage in HOOK_STAGES:  # the base hook does nothing at any stage
        call_hooks([HookBase()], stage, trainer)


def test_base_trainer_lifecycle_calls_its_hooks():
    class Counting(HookBase):
        def __init__(self):
            self.stages = []

        def before_train(self, trainer):
            self.stages.append("before_train")

        def before_epoch(self, trainer):
            self.stages.append(f"before_epoch {trainer.epoch}")

        def after_epoch(self, trainer):
            self.stages.append(f"after_epoch {trainer.epoch} weights {trainer.weights_epoch}")

        def after_train(self, trainer):
            self.stages.append("after_train")

    class Loop(TrainerBase):
        def run_epoch(self):
            hook.stages.append(f"run_epoch {self.epoch}")

    hook = Counting()
    trainer = Loop()
    trainer.register_hooks([hook])
    trainer.train(1, 3)
    assert hook.stages == [
        "before_train",
        "before_epoch 1", "run_epoch 1", "after_epoch 1 weights 2",
        "before_epoch 2", "run_epoch 2", "after_epoch 2 weights 3",
        "after_train",
    ]
