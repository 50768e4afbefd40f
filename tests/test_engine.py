"""Tests of the trainer engine (registry, lifecycle, Dassl's outputs, our additions): log lines, checkpoints, exact
resume, load_model, results.json, precision, registry errors.

A tiny registered dataset (3 classes of 12x12 JPEGs) and a registered TrainerX subclass (a frozen
linear feature layer, a trainable linear head and a class-dependent buffer) run on the CPU with
random resized crops and flips, so every run draws from the random number generators.
"""
import datetime
import json
import os
import os.path as osp
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from toy_images import NUM_CLASSES, SPLIT_SIZES, ToyColourDataset, quietly, write_toy_images
from yacs.config import CfgNode

import vlprompt
from vlprompt.config import get_cfg_default
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.engine import TRAINER_REGISTRY, TrainerBase, TrainerX, build_trainer
from vlprompt.engine.amp import MixedPrecision, resolve_precision
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import set_random_seed

BATCH_SIZE = 3  # 15 training images -> 5 batches per epoch
BASE_LR = 0.5
# Constant warm-up (1 epoch at 1e-5), then cosine over MAX_EPOCH = 3: 0.5, 0.5 * (1 + cos(pi / 3)) / 2.
EPOCH_LRS = [1e-5, 0.5, 0.375]

PROGRESS_LINE = re.compile(
    r"^epoch \[(\d+)/(\d+)\] batch \[(\d+)/(\d+)\] "
    r"time \d+\.\d{3} \(\d+\.\d{3}\) data \d+\.\d{3} \(\d+\.\d{3}\) "
    r"loss \d+\.\d{4} \(\d+\.\d{4}\) acc \d+\.\d{4} \(\d+\.\d{4}\) "
    r"lr (\d\.\d{4}e[+-]\d{2}) eta (\d+:\d{2}:\d{2})$"
)

RESULTS_KEYS = {
    "trainer", "config_file", "dataset_config_file", "dataset", "dataset_config", "num_shots",
    "subsample_classes", "seed", "backbone", "split", "eval_role", "epoch", "eval_only", "model_dir", "load_epoch",
    "metrics", "num_classes", "num_test", "wall_time_s", "completed", "finished_at", "output_dir",
    "vlprompt_version", "skipped_images", "skipped_nonfinite_steps",
}


@DATASET_REGISTRY.register()
class EngineToyDataset(ToyColourDataset):
    """The toy images of tests/toy_images.py: 3 classes (train 5, val 1, test 2 per class)."""


class ToyNet(nn.Module):
    """Images [B, 3, 8, 8] -> logits [B, num_classes]: frozen linear features, trainable head, class bias buffer."""

    def __init__(self, num_classes):
        super().__init__()
        self.features = nn.Linear(3 * 8 * 8, 16)
        self.features.requires_grad_(False)
        self.head = nn.Linear(16, num_classes)
        self.register_buffer("class_bias", torch.zeros(num_classes))

    def forward(self, images):
        return self.head(self.features(images.flatten(1))) + self.class_bias


@TRAINER_REGISTRY.register()
class EngineToyTrainer(TrainerX):
    """Registers ToyNet as "toy"; records the lr in effect at the start of every epoch."""

    def build_model(self):
        self.model = ToyNet(self.num_classes).to(self.device)
        self.optim = build_optimizer(self.model, self.cfg.OPTIM)
        self.sched = build_lr_scheduler(self.optim, self.cfg.OPTIM)
        self.register_model("toy", self.model, self.optim, self.sched)
        self.epoch_lrs = []

    def before_epoch(self):
        self.epoch_lrs.append(self.get_current_lr())

    def parse_batch_train(self, batch):
        return batch["img"].to(self.device), batch["label"].to(self.device)

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        with self.autocast():
            logits = self.model(images)
            loss = F.cross_entropy(logits, labels)
        self.model_backward_and_update(loss)
        if self.batch_idx + 1 == self.num_batches:
            self.update_lr()
        return {"loss": loss.item(), "acc": compute_accuracy(logits, labels)[0].item()}

    def get_class_dependent_keys(self, name):
        return ["class_bias"]


class SimulatedKill(Exception):
    """Stands for the process being killed."""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """Folder of the toy dataset's JPEGs: one base colour per class plus noise."""
    return str(write_toy_images(tmp_path_factory.mktemp("toy_data")))


def make_cfg(data_root, output_dir, max_epoch=3, checkpoint_freq=0, print_freq=2, final_model="last_step",
             save_frozen=False, prec=None):
    cfg = get_cfg_default()
    cfg.SEED = 1
    cfg.USE_CUDA = False
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.DATASET.ROOT = data_root
    cfg.DATASET.NAME = "EngineToyDataset"
    cfg.INPUT.SIZE = (8, 8)
    cfg.INPUT.TRANSFORMS = ("random_resized_crop", "random_flip", "normalize")
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = BATCH_SIZE
    cfg.DATALOADER.TEST.BATCH_SIZE = 4
    cfg.OPTIM.NAME = "sgd"
    cfg.OPTIM.LR = BASE_LR
    cfg.OPTIM.MAX_EPOCH = max_epoch
    cfg.OPTIM.LR_SCHEDULER = "cosine"
    cfg.OPTIM.WARMUP_EPOCH = 1
    cfg.OPTIM.WARMUP_TYPE = "constant"
    cfg.OPTIM.WARMUP_CONS_LR = 1e-5
    cfg.TRAIN.CHECKPOINT_FREQ = checkpoint_freq
    cfg.TRAIN.PRINT_FREQ = print_freq
    cfg.TRAIN.SAVE_FROZEN_WEIGHTS = save_frozen
    cfg.TEST.FINAL_MODEL = final_model
    cfg.TRAINER.NAME = "EngineToyTrainer"
    if prec is not None:
        cfg.TRAINER.ENGINETOYTRAINER = CfgNode({"PREC": prec})
    cfg.freeze()
    return cfg


def build_seeded(cfg):
    """What train.py does before training: seed everything, then build the trainer."""
    set_random_seed(cfg.SEED)
    return build_trainer(cfg)


@pytest.fixture(scope="module")
def full_run(data_root, tmp_path_factory):
    """An uninterrupted 3-epoch run (CHECKPOINT_FREQ 0): (trainer, stdout lines)."""
    cfg = make_cfg(data_root, tmp_path_factory.mktemp("full_run"))

    def run():
        trainer = build_seeded(cfg)
        trainer.train()
        return trainer

    return quietly(run)


def read_results(output_dir):
    with open(osp.join(output_dir, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def test_progress_lines_follow_print_freq_and_show_the_lr_in_effect(full_run):
    trainer, lines = full_run
    progress = [line for line in lines if line.startswith("epoch [")]
    matches = [PROGRESS_LINE.match(line) for line in progress]
    assert all(matches), progress
    # 5 batches per epoch, PRINT_FREQ 2: batches 2 and 4 are printed, batch 5 is not.
    assert [(m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)) for m in matches] == [
        ("1", "3", "2", "5", "1.0000e-05"),
        ("1", "3", "4", "5", "1.0000e-05"),
        ("2", "3", "2", "5", "5.0000e-01"),
        ("2", "3", "4", "5", "5.0000e-01"),
        ("3", "3", "2", "5", "3.7500e-01"),
        ("3", "3", "4", "5", "3.7500e-01"),
    ]
    assert trainer.epoch_lrs == pytest.approx(EPOCH_LRS)


def test_every_batch_is_printed_when_an_epoch_has_fewer_batches_than_print_freq(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path, max_epoch=1, print_freq=10)))
    _, lines = quietly(trainer.train)
    matches = [PROGRESS_LINE.match(line) for line in lines if line.startswith("epoch [")]
    assert [(m.group(3), m.group(5)) for m in matches] == [
        ("1", "1.0000e-05"), ("2", "1.0000e-05"), ("3", "1.0000e-05"), ("4", "1.0000e-05"),
        ("5", "5.0000e-01"),  # the scheduler steps at the last batch, before the line is printed
    ]
    assert matches[-1].group(6) == "0:00:00"


def test_after_train_prints_dassl_lines_in_order(full_run):
    trainer, lines = full_run
    start = lines.index("Finish training")
    assert lines[start + 1 : start + 3] == ["Deploy the last-epoch model", "Evaluate on the *test* set"]
    assert "=> result" in lines[start + 3 :]
    assert re.fullmatch(r"Elapsed: \d+:\d{2}:\d{2}", lines[-1])
    assert lines[0] == "Loading trainer: EngineToyTrainer"
    assert "No checkpoint found, train from scratch" in lines
    tensorboard_dir = osp.join(trainer.output_dir, "tensorboard")
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        notices = [line for line in lines if line.startswith("Tensorboard is not installed")]
        assert len(notices) == 1 and trainer._writer is None
    else:
        assert f"Initialize tensorboard (log_dir={tensorboard_dir})" in lines


def test_only_last_epoch_is_saved_with_pointer_file(full_run):
    trainer, lines = full_run
    model_dir = osp.join(trainer.output_dir, "toy")
    assert sorted(os.listdir(model_dir)) == ["checkpoint", "model.pth.tar-3"]
    with open(osp.join(model_dir, "checkpoint"), encoding="utf-8") as f:
        assert f.read() == "model.pth.tar-3\n"
    assert f"Checkpoint saved to {osp.join(model_dir, 'model.pth.tar-3')}" in lines


def test_checkpoint_content_drops_frozen_parameters_and_loads_weights_only(full_run):
    trainer, _ = full_run
    checkpoint = torch.load(osp.join(trainer.output_dir, "toy", "model.pth.tar-3"), weights_only=True)
    assert set(checkpoint) == {
        "state_dict", "epoch", "optimizer", "scheduler", "val_result", "rng_state", "scaler", "trainer_state"
    }
    assert checkpoint["epoch"] == 3
    assert checkpoint["val_result"] is None
    assert checkpoint["scaler"] is None  # CPU runs in fp32
    assert checkpoint["trainer_state"] == {"best_result": float("-inf"), "nonfinite_steps": 0}
    assert list(checkpoint["state_dict"]) == ["class_bias", "head.weight", "head.bias"]
    for key, value in checkpoint["state_dict"].items():
        assert torch.equal(value, trainer.model.state_dict()[key])
    assert checkpoint["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.5 * (1 + np.cos(np.pi * 2 / 3)) / 2)


def test_save_frozen_weights_keeps_frozen_parameters(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path, save_frozen=True)))
    quietly(lambda: trainer.save_model(0, str(tmp_path)))
    checkpoint = torch.load(tmp_path / "toy" / "model.pth.tar-1", weights_only=True)
    assert list(checkpoint["state_dict"]) == ["class_bias", "features.weight", "features.bias", "head.weight", "head.bias"]


def test_killed_and_resumed_run_equals_uninterrupted_run(full_run, data_root, tmp_path):
    full, _ = full_run
    cfg = make_cfg(data_root, tmp_path, checkpoint_freq=1)
    first, _ = quietly(lambda: build_seeded(cfg))
    after_epoch = first.after_epoch

    def after_epoch_then_kill():
        after_epoch()
        raise SimulatedKill

    first.after_epoch = after_epoch_then_kill
    with pytest.raises(SimulatedKill):
        quietly(first.train)
    assert sorted(os.listdir(tmp_path / "toy")) == ["checkpoint", "model.pth.tar-1"]

    resumed, _ = quietly(lambda: build_seeded(cfg))
    _, lines = quietly(resumed.train)

    assert f"Found checkpoint at {tmp_path} (will resume training)" in lines
    assert f'** RESUMING: "{tmp_path}" already holds checkpoints of an earlier run.' in lines
    assert (
        "** Training resumes after epoch 1: the next epoch is 2/3 "
        "(weights, optimizer, scheduler and RNG states restored)." in lines
    )
    assert "** To start a fresh run instead, use another --output-dir or add --restart (which moves the old files aside)." in lines
    assert [line for line in lines if line.startswith("epoch [")][0].startswith("epoch [2/3] batch [2/5]")

    assert resumed.epoch_lrs == full.epoch_lrs[1:]
    full_state, resumed_state = full.model.state_dict(), resumed.model.state_dict()
    assert list(full_state) == list(resumed_state)
    for key in full_state:
        assert torch.equal(full_state[key], resumed_state[key]), key
    assert resumed.last_test["metrics"] == full.last_test["metrics"]
    assert sorted(os.listdir(tmp_path / "toy")) == ["checkpoint", "model.pth.tar-1", "model.pth.tar-2", "model.pth.tar-3"]

    relaunched, _ = quietly(lambda: build_seeded(cfg))
    _, lines = quietly(relaunched.train)
    assert (
        "** All 3 epochs are already done (checkpoint of epoch 3): training is skipped "
        "and the final model is evaluated again." in lines
    )
    assert not [line for line in lines if line.startswith("epoch [")]
    assert "Finish training" in lines
    assert read_results(str(tmp_path))["epoch"] == 3


def test_load_model_by_epoch_keeps_class_dependent_buffers(full_run, data_root, tmp_path):
    full, _ = full_run
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path)))
    trainer.model.class_bias.fill_(7.0)
    _, lines = quietly(lambda: trainer.load_model(full.output_dir, epoch=3))
    path = osp.join(full.output_dir, "toy", "model.pth.tar-3")
    assert lines == [f'Loading weights to toy from "{path}" (epoch = 3)']
    assert torch.equal(trainer.model.head.weight, full.model.head.weight)
    assert torch.equal(trainer.model.class_bias, torch.full((NUM_CLASSES,), 7.0))
    assert trainer.weights_epoch == 3


def test_load_model_reports_missing_file_with_available_epochs(full_run, data_root, tmp_path):
    full, _ = full_run
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path)))
    path = osp.join(full.output_dir, "toy", "model.pth.tar-7")
    with pytest.raises(FileNotFoundError) as error:
        trainer.load_model(full.output_dir, epoch=7)
    assert str(error.value) == (
        f'Model not found at "{path}" (model.pth.tar-N files in that folder: model.pth.tar-3; '
        "pick one with --load-epoch N)"
    )
    nowhere = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError) as error:
        trainer.load_model(nowhere, epoch=1)
    assert str(error.value) == (
        f'Model not found at "{osp.join(nowhere, "toy", "model.pth.tar-1")}" '
        f'(the folder "{osp.join(nowhere, "toy")}" does not exist; check --model-dir)'
    )
    _, lines = quietly(lambda: trainer.load_model(""))
    assert lines == [
        "Note that load_model() is skipped as no pretrained model is given (ignore this if it's done on purpose)"
    ]


def test_load_model_reports_unexpected_and_missing_keys(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path)))
    state_dict = {"head.weight": torch.ones(NUM_CLASSES, 16), "extra.weight": torch.ones(2)}
    os.makedirs(tmp_path / "toy")
    torch.save({"state_dict": state_dict, "epoch": 4, "val_result": 61.04}, tmp_path / "toy" / "model.pth.tar-4")
    _, lines = quietly(lambda: trainer.load_model(str(tmp_path), epoch=4))
    assert lines == [
        f'Loading weights to toy from "{tmp_path / "toy" / "model.pth.tar-4"}" (epoch = 4, val_result = 61.0)',
        "Warning: keys in the checkpoint that toy does not have (ignored): ['extra.weight']",
        "Warning: keys of toy missing from the checkpoint (current values kept): ['head.bias']",
    ]
    assert torch.equal(trainer.model.head.weight, torch.ones(NUM_CLASSES, 16))


def test_results_file_after_training(full_run):
    trainer, lines = full_run
    results = read_results(trainer.output_dir)
    assert set(results) == RESULTS_KEYS
    assert f"Results saved to {osp.join(trainer.output_dir, 'results.json')}" in lines
    expected = {
        "trainer": "EngineToyTrainer", "config_file": "", "dataset_config_file": "", "dataset": "EngineToyDataset",
        "dataset_config": "", "num_shots": -1, "subsample_classes": "all", "seed": 1, "backbone": "",
        "split": "test", "eval_role": "source", "epoch": 3, "eval_only": False, "model_dir": "", "load_epoch": None,
        "num_classes": NUM_CLASSES, "num_test": NUM_CLASSES * SPLIT_SIZES["test"], "completed": True,
        "skipped_images": {"train": 0, "val": 0, "test": 0}, "skipped_nonfinite_steps": 0,
        "output_dir": trainer.output_dir, "vlprompt_version": vlprompt.__version__,
    }
    assert {key: results[key] for key in expected} == expected
    assert results["metrics"] == trainer.last_test["metrics"]
    assert list(results["metrics"])[0] == "accuracy"
    assert results["wall_time_s"] > 0
    assert datetime.datetime.fromisoformat(results["finished_at"]).tzinfo is not None


def test_eval_only_results_record_loaded_epoch_and_zero_shot_records_zero(full_run, data_root, tmp_path):
    full, _ = full_run
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path / "eval")))
    trainer.run_info.update(
        config_file="configs/trainers/Toy/toy.yaml",
        dataset_config_file="configs/datasets/toy_set.yaml",
        eval_only=True,
        model_dir=full.output_dir,
        load_epoch=3,
    )
    quietly(lambda: trainer.load_model(full.output_dir, epoch=3))
    quietly(trainer.test)
    quietly(trainer.save_results)
    results = read_results(str(tmp_path / "eval"))
    assert (results["epoch"], results["eval_only"], results["load_epoch"]) == (3, True, 3)
    assert (results["model_dir"], results["dataset_config"]) == (full.output_dir, "toy_set")
    assert results["config_file"] == "configs/trainers/Toy/toy.yaml"
    # Same seed, so the same frozen layer: the loaded model scores exactly what the trained one did.
    assert results["metrics"] == full.last_test["metrics"]

    zero_shot, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path / "zero_shot")))
    quietly(lambda: zero_shot.load_model(""))
    quietly(zero_shot.test)
    quietly(zero_shot.save_results)
    assert read_results(str(tmp_path / "zero_shot"))["epoch"] == 0


def test_save_results_before_test_is_an_error(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path)))
    with pytest.raises(RuntimeError, match=r"test\(\) has not run yet"):
        trainer.save_results()


def test_best_val_selects_on_val_and_deploys_the_best_checkpoint(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path, max_epoch=2, final_model="best_val")))
    _, lines = quietly(trainer.train)
    assert lines.count("Evaluate on the *val* set") == 2
    best = torch.load(tmp_path / "toy" / "model-best.pth.tar", weights_only=True)
    assert best["val_result"] == trainer.best_result
    assert best["trainer_state"] == {"best_result": trainer.best_result, "nonfinite_steps": 0}
    start = lines.index("Finish training")
    assert lines[start + 1 : start + 3] == [
        "Deploy the model with the best val performance",
        f'Loading weights to toy from "{tmp_path / "toy" / "model-best.pth.tar"}" '
        f'(epoch = {best["epoch"]}, val_result = {best["val_result"]:.1f})',
    ]
    assert read_results(str(tmp_path))["epoch"] == best["epoch"]


def test_val_split_falls_back_to_test_with_a_warning(data_root, tmp_path):
    trainer, _ = quietly(lambda: build_seeded(make_cfg(data_root, tmp_path)))
    trainer.val_loader = None  # a dataset without a val split
    _, lines = quietly(lambda: trainer.test(split="val"))
    assert lines[:2] == [
        "Warning: the dataset has no val split, so the *test* set is evaluated instead "
        "(with TEST.FINAL_MODEL best_val the model is then selected on test data)",
        "Evaluate on the *test* set",
    ]
    assert trainer.last_test["split"] == "test"
    assert trainer.last_test["num_samples"] == NUM_CLASSES * SPLIT_SIZES["test"]


def test_unknown_trainer_lists_every_registered_name(data_root, tmp_path):
    cfg = make_cfg(data_root, tmp_path)
    cfg.defrost()
    cfg.TRAINER.NAME = "EngineToyTrainr"
    with pytest.raises(ValueError) as error:
        build_trainer(cfg)
    assert str(error.value) == (
        f"The requested one is expected to belong to {TRAINER_REGISTRY.registered_names()}, "
        "but got [EngineToyTrainr] (do you mean [EngineToyTrainer]?)"
    )


def test_precision_is_resolved_from_the_trainer_node_and_is_fp32_on_cpu(data_root, tmp_path):
    assert resolve_precision(make_cfg(data_root, tmp_path)) == "fp32"
    cfg = make_cfg(data_root, tmp_path, prec="fp16")
    assert resolve_precision(cfg) == "fp16"
    trainer, lines = quietly(lambda: build_seeded(cfg))
    assert ("Precision fp16 was requested but the device is cpu: running in fp32 "
            "(TRAIN.CPU_AUTOCAST True autocasts on the CPU)") in lines
    assert (trainer.prec, trainer.amp.scaler) == ("fp32", None)
    with trainer.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ValueError, match=r"expected one of \['fp32', 'fp16', 'amp', 'bf16'\]"):
        MixedPrecision("fp8", torch.device("cpu"))


def test_cpu_autocast_is_opt_in():
    """On the CPU every precision runs in fp32 unless TRAIN.CPU_AUTOCAST, which autocasts (and
    scales fp16 gradients) as on CUDA."""
    cpu = torch.device("cpu")
    for prec, dtype in (("fp16", torch.float16), ("amp", torch.float16), ("bf16", torch.bfloat16)):
        assert (MixedPrecision(prec, cpu).dtype, MixedPrecision(prec, cpu).scaler) == (None, None)
        amp = MixedPrecision(prec, cpu, cpu_autocast=True)
        assert (amp.prec, amp.dtype, amp.scaler is not None) == (prec, dtype, dtype is torch.float16)
        with amp.autocast():
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
    fp32 = MixedPrecision("fp32", cpu, cpu_autocast=True)
    assert (fp32.dtype, fp32.scaler) == (None, None)


def test_scaler_is_dropped_when_the_trainer_keeps_half_precision_parameters(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA, GradScaler("cuda") warns and disables itself
        amp = MixedPrecision("fp16", torch.device("cuda"))
    assert amp.scaler is not None
    fp32_optim = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    amp.drop_scaler_for_half_parameters([fp32_optim])
    assert amp.scaler is not None
    half_optim = torch.optim.SGD(nn.Linear(2, 2).half().parameters(), lr=0.1)
    amp.drop_scaler_for_half_parameters([fp32_optim, half_optim])
    assert amp.scaler is None and amp.state_dict() is None
    assert capsys.readouterr().out.startswith("Note: the optimizer holds half-precision parameters")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("prec, dtype, has_scaler", [("fp16", torch.float16, True), ("amp", torch.float16, True),
                                                     ("bf16", torch.bfloat16, False), ("fp32", torch.float32, False)])
def test_cuda_precisions_autocast_and_scale(prec, dtype, has_scaler):
    amp = MixedPrecision(prec, torch.device("cuda"))
    layer = nn.Linear(4, 2).cuda()
    optim = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = layer.weight.detach().clone()
    with amp.autocast():
        output = layer(torch.ones(3, 4, device="cuda"))
    assert output.dtype == dtype
    assert layer.weight.dtype == torch.float32
    # a mean, not a sum: GradScaler's first scale is 2**16, and d(sum)/d(output) = 2**16 would
    # overflow the fp16 output's gradient (max 65504), so the scaler would rightly skip the step
    amp.backward(output.float().mean())
    amp.step([optim])
    assert not torch.equal(before, layer.weight)
    assert (amp.scaler is not None) == has_scaler
    assert (amp.state_dict() is not None) == has_scaler


def test_base_trainer_model_registry_and_anomaly_checks():
    class RegistersTooEarly(TrainerBase):
        def __init__(self):
            self.register_model("model", nn.Linear(1, 1))

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first"):
        RegistersTooEarly()
    trainer = TrainerBase()
    trainer.register_model("a", nn.Linear(1, 1))
    trainer.register_model("b", nn.Linear(1, 1))
    with pytest.raises(AssertionError, match="Found duplicate model names"):
        trainer.register_model("a", nn.Linear(1, 1))
    assert trainer.get_model_names() == ["a", "b"]
    assert trainer.get_model_names("b") == ["b"]
    with pytest.raises(KeyError, match="registered models: \\['a', 'b'\\]"):
        trainer.get_model_names(["c"])
    trainer.set_model_mode("eval")
    assert not trainer._models["a"].training
    with pytest.raises(KeyError, match='Unknown model mode "bogus"'):
        trainer.set_model_mode("bogus")
    with pytest.raises(FloatingPointError, match="Loss is infinite or NaN!"):
        trainer.detect_anomaly(torch.tensor([1.0, float("nan")]))
    trainer.detect_anomaly(torch.tensor(1.0))
