"""Trainer lifecycle with Dassl's names: ``TrainerBase``, ``SimpleTrainer``, ``TrainerX`` (engine spec §5).

What CoOp-family trainers rely on (constructor order, hooks, log lines, checkpoint layout) follows
Dassl 0.6.3. Our additions ([decision]s of the spec and the lead's brief):

* precision: ``self.prec``, ``self.autocast()`` and a GradScaler inside ``model_backward_and_update``
  (see :mod:`vlprompt.engine.amp`);
* checkpoints also hold "rng_state", "scaler" and "trainer_state", drop frozen parameters unless
  ``TRAIN.SAVE_FROZEN_WEIGHTS``, and resuming is exact (highest ``model.pth.tar-N``, RNG restored);
* ``load_model`` is the CoOp-family override generalised (class-dependent keys via
  ``get_class_dependent_keys``, non-strict loading with a report);
* ``results.json`` after every final evaluation (see :mod:`vlprompt.engine.results`);
* reliability (issue 11): mid-epoch checkpoints every TRAIN.CHECKPOINT_ITERS iterations that
  resume bit-identically (sampler position, RNG states), resuming from the newest checkpoint
  that loads (see :mod:`vlprompt.engine.resume`), image checks before training
  (DATASET.CHECK_IMAGES / SKIP_BAD_IMAGES), label checks, and non-finite losses that stop the
  run with the step and the loss terms (TRAIN.NONFINITE_LOSS).
"""
import datetime
import os
import os.path as osp
import re
import time
from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from vlprompt.config.validate import check_training_cfg, validate_cfg
from vlprompt.data import DataManager
from vlprompt.data.checks import DatasetContentError, check_images, check_labels
from vlprompt.evaluation import build_evaluator
from vlprompt.utils import (
    AverageMeter,
    CheckpointError,
    MetricMeter,
    get_rng_state,
    load_checkpoint,
    mkdir_if_missing,
    restore_checkpoint,
    save_checkpoint,
    set_rng_state,
    tolist_if_not,
)

from .amp import MixedPrecision, resolve_precision
from .resume import find_resume_point, mid_epoch_file_name, prune_mid_epoch_checkpoints
from .results import RUN_INFO_DEFAULTS, make_results_record, write_results

_EPOCH_FILE_PATTERN = re.compile(r"^model\.pth\.tar-(\d+)$")


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DistributedDataParallel, else ``model``."""
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


def _frozen_parameter_names(model: nn.Module) -> set:
    """State-dict names of the parameters of ``model`` with ``requires_grad`` False (aliases included)."""
    return {name for name, param in model.named_parameters(remove_duplicate=False) if not param.requires_grad}


def _format_loss(loss: torch.Tensor) -> str:
    """A loss value for messages: the number, or the list of values of a non-scalar loss."""
    values = loss.detach().float().flatten().tolist()
    return f"{values[0]:.6g}" if len(values) == 1 else str([float(f"{v:.6g}") for v in values])


def _epoch_checkpoint_files(folder: str) -> list:
    """Names of the ``model.pth.tar-N`` files in ``folder``, by increasing N ([] if the folder is missing)."""
    if not osp.isdir(folder):
        return []
    names = [name for name in os.listdir(folder) if _EPOCH_FILE_PATTERN.match(name)]
    return sorted(names, key=lambda name: int(_EPOCH_FILE_PATTERN.match(name).group(1)))


class NonFiniteLossError(FloatingPointError):
    """The loss is infinite or NaN; the message gives the step, the loss terms and the last checkpoint."""


class TrainerBase:
    """Model registry, optimisation steps, checkpoints and the epoch loop, independent of data.

    Attributes:
        _models, _optims, _scheds (OrderedDict): registered modules and their optimizer and
            scheduler (either may be None), keyed by model name (= checkpoint sub-folder).
        amp (MixedPrecision): autocast and gradient scaling (fp32 until a subclass sets it).
        save_frozen_weights (bool): keep ``requires_grad=False`` parameters in saved state dicts.
        weights_epoch (int): completed training epochs of the weights the models hold now
            (0 for untrained weights; set by training, resuming and ``load_model``).
        run_info (dict): facts of the run that are not in the config, filled by train.py
            (keys of ``vlprompt.engine.results.RUN_INFO_DEFAULTS``).
        time_created (float): ``time.time()`` when the trainer was created.
        nonfinite_loss (str): "stop" (raise NonFiniteLossError) or "skip" (leave the weights
            unchanged for that step and count it in ``nonfinite_steps``).
        last_checkpoint (str or None): path of the checkpoint written or resumed from last.
    """

    def __init__(self):
        self._models = OrderedDict()
        self._optims = OrderedDict()
        self._scheds = OrderedDict()
        self._writer = None
        self.amp = MixedPrecision("fp32", torch.device("cpu"))
        self.save_frozen_weights = False
        self.weights_epoch = 0
        self.run_info = dict(RUN_INFO_DEFAULTS)
        self.time_created = time.time()
        self.nonfinite_loss = "stop"
        self.nonfinite_steps = 0
        self.last_checkpoint = None
        self._step_skipped = False
        self._pending_mid_epoch = None

    # ----------------------------------------------------------------------------------------
    # Model registry
    # ----------------------------------------------------------------------------------------
    def register_model(self, name="model", model=None, optim=None, sched=None):
        """Register ``model`` (and its optimizer and scheduler, may be None) under ``name``."""
        if self.__dict__.get("_models") is None:
            raise AttributeError(
                "Cannot register a model before TrainerBase.__init__() has run: call super().__init__() first"
            )
        if name in self._models:
            raise AssertionError(f'Found duplicate model names: "{name}" is already registered')
        self._models[name] = model
        self._optims[name] = optim
        self._scheds[name] = sched

    def get_model_names(self, names=None):
        """All registered names in registration order, or ``names`` (a name or list) after checking them."""
        registered = list(self._models.keys())
        if names is None:
            return registered
        names = tolist_if_not(names)
        for name in names:
            if name not in registered:
                raise KeyError(f"No model registered as {name!r}; registered models: {registered}")
        return names

    def set_model_mode(self, mode="train", names=None):
        """Put the models in training ("train") or evaluation ("test" / "eval") mode."""
        for name in self.get_model_names(names):
            if mode == "train":
                self._models[name].train()
            elif mode in ("test", "eval"):
                self._models[name].eval()
            else:
                raise KeyError(f'Unknown model mode "{mode}": expected "train", "test" or "eval"')

    def get_class_dependent_keys(self, name):
        """State-dict keys of model ``name`` that depend on the class list (list of str).

        ``load_model`` deletes them from a checkpoint before loading, so the values built for
        the current classes stay (e.g. CoOp's ``["token_prefix", "token_suffix"]``). Default: none.
        """
        return []

    # ----------------------------------------------------------------------------------------
    # Optimisation steps
    # ----------------------------------------------------------------------------------------
    def autocast(self):
        """Context manager for forward passes: autocast at the trainer's precision (no-op for fp32 / CPU)."""
        return self.amp.autocast()

    def update_lr(self, names=None):
        """Step the scheduler of each (given) model once."""
        for name in self.get_model_names(names):
            if self._scheds[name] is not None:
                self._scheds[name].step()

    def detect_anomaly(self, loss, terms=None):
        """Raise NonFiniteLossError (a FloatingPointError) if any element of ``loss`` is infinite or NaN.

        The message starts with "Loss is infinite or NaN!" and gives the step, the loss terms
        (``terms``: name -> number or tensor, optional) and the last checkpoint written.
        """
        if not torch.isfinite(loss).all():
            raise NonFiniteLossError(
                f"Loss is infinite or NaN! {self._step_description(loss, terms)} Training stopped before "
                "this step changed the weights. "
                + self._last_checkpoint_note()
                + " Lower OPTIM.LR, check the data, or set TRAIN.NONFINITE_LOSS skip to skip such steps."
            )

    def _step_description(self, loss, terms):
        """"At epoch E/M, batch B/NB: loss = L (a = ..., b = ...)." for the current step."""
        where = ""
        if hasattr(self, "batch_idx") and hasattr(self, "num_batches"):
            where = f"At epoch {self.epoch + 1}/{self.max_epoch}, batch {self.batch_idx + 1}/{self.num_batches}: "
        values = ", ".join(f"{name} = {_format_loss(torch.as_tensor(value))}" for name, value in (terms or {}).items())
        return f"{where}loss = {_format_loss(loss)}" + (f" ({values})." if values else ".")

    def _last_checkpoint_note(self):
        if self.last_checkpoint is None:
            return "No checkpoint has been written yet (TRAIN.CHECKPOINT_ITERS sets mid-epoch checkpoints)."
        others = " with the same file of every other model" if len(self._models) > 1 else ""
        return f'The last good checkpoint is kept: "{self.last_checkpoint}"{others}.'

    def model_zero_grad(self, names=None):
        for name in self.get_model_names(names):
            if self._optims[name] is not None:
                self._optims[name].zero_grad()

    def model_backward(self, loss, terms=None):
        """Check ``loss`` for inf/NaN, then back-propagate it (scaled when a GradScaler is active).

        A non-finite loss raises NonFiniteLossError, or with ``nonfinite_loss == "skip"`` is
        counted and not back-propagated, and the next ``model_update`` does not step.
        """
        if self.nonfinite_loss == "skip" and not torch.isfinite(loss).all():
            self.nonfinite_steps += 1
            self._step_skipped = True
            print(f"Skipping a step with a non-finite loss (TRAIN.NONFINITE_LOSS skip): {self._step_description(loss, terms)}")
            return
        self.detect_anomaly(loss, terms)
        self.amp.backward(loss)

    def model_update(self, names=None):
        """Step the optimizer of each (given) model (through the GradScaler when active).

        After a skipped non-finite loss nothing is stepped and the GradScaler, if any, lowers
        its scale as it does after an overflow.
        """
        if self._step_skipped:
            self._step_skipped = False
            self.amp.skip_step()
            return
        optims = [self._optims[name] for name in self.get_model_names(names)]
        self.amp.step([optim for optim in optims if optim is not None])

    def model_backward_and_update(self, loss, names=None, terms=None):
        """zero_grad, backward and optimizer step for the (given) models (``terms``: see ``detect_anomaly``)."""
        self.model_zero_grad(names)
        self.model_backward(loss, terms)
        self.model_update(names)

    # ----------------------------------------------------------------------------------------
    # Tensorboard
    # ----------------------------------------------------------------------------------------
    def init_writer(self, log_dir):
        """Create the tensorboard writer once; without the tensorboard package print a notice and go on."""
        if self._writer is not None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("Tensorboard is not installed: training runs without a tensorboard writer (pip install tensorboard)")
            return
        print(f"Initialize tensorboard (log_dir={log_dir})")
        self._writer = SummaryWriter(log_dir=log_dir)

    def write_scalar(self, tag, scalar_value, global_step=None):
        if self._writer is not None:
            self._writer.add_scalar(tag, scalar_value, global_step)

    def close_writer(self):
        if self._writer is not None:
            self._writer.close()

    # ----------------------------------------------------------------------------------------
    # Training loop
    # ----------------------------------------------------------------------------------------
    def train(self, start_epoch, max_epoch):
        """Run epochs ``start_epoch .. max_epoch - 1`` (``before_train`` may move ``start_epoch`` by resuming)."""
        self.start_epoch = start_epoch
        self.max_epoch = max_epoch
        self.before_train()
        for self.epoch in range(self.start_epoch, self.max_epoch):
            self.before_epoch()
            self.run_epoch()
            self.weights_epoch = self.epoch + 1
            self.after_epoch()
        self.after_train()

    def before_train(self):
        pass

    def after_train(self):
        pass

    def before_epoch(self):
        pass

    def after_epoch(self):
        pass

    def run_epoch(self):
        raise NotImplementedError

    def test(self):
        raise NotImplementedError

    def parse_batch_train(self, batch):
        raise NotImplementedError

    def parse_batch_test(self, batch):
        raise NotImplementedError

    def forward_backward(self, batch):
        raise NotImplementedError

    def model_inference(self, input):
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------
    # Trainer-wide state stored in every checkpoint
    # ----------------------------------------------------------------------------------------
    def get_trainer_state(self):
        """Trainer state (plain numbers/containers/tensors) saved in checkpoints as "trainer_state".

        Override together with :meth:`set_trainer_state` for state that resuming must restore
        and that lives outside the registered models. Default: {}.
        """
        return {}

    def set_trainer_state(self, state):
        """Restore what :meth:`get_trainer_state` returned (called when resuming)."""

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------
    def save_model(self, epoch, directory, is_best=False, val_result=None, model_name=""):
        """Save every registered model to ``directory/<name>/`` (file ``model_name`` or ``model.pth.tar-<epoch+1>``).

        Each file holds "state_dict" (without frozen parameters unless ``save_frozen_weights``;
        buffers always kept), "epoch" (epoch + 1), "optimizer", "scheduler", "val_result",
        "rng_state", "scaler" and "trainer_state".
        """
        paths = [
            save_checkpoint(
                self._checkpoint_state(name, epoch + 1, val_result),
                osp.join(directory, name),
                is_best=is_best,
                model_name=model_name,
            )
            for name in self.get_model_names()
        ]
        if paths and not model_name:
            self.last_checkpoint = paths[0]

    def save_mid_epoch_model(self, directory, batches_done, data_position):
        """Save every registered model as ``directory/<name>/model.pth.tar-E-batchB`` (E = ``self.epoch``).

        The file holds what ``save_model`` saves, with "epoch" = E (completed epochs), plus
        "mid_epoch" = ``data_position`` (batches done, batches per epoch, sampler state).
        Only the ``MID_EPOCH_KEEP`` newest mid-epoch files are kept per model.
        """
        paths = []
        for name in self.get_model_names():
            state = self._checkpoint_state(name, self.epoch, None)
            state["mid_epoch"] = dict(data_position, batches_done=batches_done)
            folder = osp.join(directory, name)
            paths.append(save_checkpoint(state, folder, model_name=mid_epoch_file_name(self.epoch, batches_done)))
            prune_mid_epoch_checkpoints(folder)
        if paths:
            self.last_checkpoint = paths[0]

    def _checkpoint_state(self, name, epochs_done, val_result):
        """The checkpoint dict of model ``name`` (tensors and plain containers only)."""
        model = _unwrap(self._models[name])
        state_dict = model.state_dict()
        if not self.save_frozen_weights:
            frozen = _frozen_parameter_names(model)
            state_dict = OrderedDict((key, value) for key, value in state_dict.items() if key not in frozen)
        optim, sched = self._optims[name], self._scheds[name]
        return {
            "state_dict": state_dict,
            "epoch": epochs_done,
            "optimizer": None if optim is None else optim.state_dict(),
            "scheduler": None if sched is None else sched.state_dict(),
            "val_result": val_result,
            "rng_state": get_rng_state(),
            "scaler": self.amp.state_dict(),
            "trainer_state": self.get_trainer_state(),
        }

    def resume_model_if_exist(self, directory):
        """Resume every registered model from the newest usable checkpoint in ``directory/<name>/``.

        The newest position (epoch or mid-epoch checkpoint) whose files load for every model is
        used; unusable newer files are skipped with a message (:func:`find_resume_point`). Loads
        weights, optimizer, scheduler, RNG, scaler and trainer states and prints a banner. After
        a mid-epoch checkpoint, the next ``run_epoch`` continues that epoch where it stopped.

        Returns:
            int: the epoch index to continue from (0 when nothing was found).
        """
        point = find_resume_point(directory, self.get_model_names())
        if point is None:
            print("No checkpoint found, train from scratch")
            return 0
        print(f"Found checkpoint at {directory} (will resume training)")
        for name in self.get_model_names():
            path, checkpoint = point.paths[name], point.checkpoints[name]
            print(f'Loading checkpoint from "{path}"')
            restore_checkpoint(checkpoint, path, self._models[name], self._optims[name], self._scheds[name])
        first = point.checkpoints[self.get_model_names()[0]]
        if first.get("rng_state") is not None:
            set_rng_state(first["rng_state"])
            print("Loaded random number generator states")
        print(f"Previous epoch: {point.epochs_done}")
        self.amp.load_state_dict(first.get("scaler"))
        self.set_trainer_state(first.get("trainer_state") or {})
        if point.mid_epoch:
            self._pending_mid_epoch = dict(first["mid_epoch"], rng_state=first.get("rng_state"))
        self.weights_epoch = point.epochs_done
        self.last_checkpoint = point.paths[self.get_model_names()[0]]
        self._print_resume_banner(directory, point.epochs_done, point.batches_done)
        return point.epochs_done

    def _print_resume_banner(self, directory, start_epoch, batches_done=0):
        if batches_done:
            plan = (
                f"** Training resumes in epoch {start_epoch + 1}/{self.max_epoch} after batch {batches_done} "
                "(weights, optimizer, scheduler, RNG states and data order restored)."
            )
        elif start_epoch >= self.max_epoch:
            plan = (
                f"** All {self.max_epoch} epochs are already done (checkpoint of epoch {start_epoch}): "
                "training is skipped and the final model is evaluated again."
            )
        else:
            plan = (
                f"** Training resumes after epoch {start_epoch}: the next epoch is "
                f"{start_epoch + 1}/{self.max_epoch} (weights, optimizer, scheduler and RNG states restored)."
            )
        line = "*" * 78
        print(
            "\n".join(
                [
                    line,
                    f'** RESUMING: "{directory}" already holds checkpoints of an earlier run.',
                    plan,
                    "** To start a fresh run instead, use another --output-dir (or delete that folder).",
                    line,
                ]
            )
        )

    def load_model(self, directory, epoch=None):
        """Load the weights of every registered model from ``directory/<name>/``.

        The file is ``model.pth.tar-<epoch>``, or ``model-best.pth.tar`` when ``epoch`` is None.
        Keys from :meth:`get_class_dependent_keys` are deleted from the checkpoint first; loading
        is non-strict and reports unexpected keys and missing keys other than frozen parameters
        (which are not saved by default). An empty ``directory`` only prints a note.

        Raises:
            FileNotFoundError: 'Model not found at "PATH"', listing the ``model.pth.tar-N`` files present.
        """
        if not directory:
            print("Note that load_model() is skipped as no pretrained model is given (ignore this if it's done on purpose)")
            return
        model_file = "model-best.pth.tar" if epoch is None else f"model.pth.tar-{epoch}"
        for name in self.get_model_names():
            model_path = osp.join(directory, name, model_file)
            if not osp.exists(model_path):
                raise FileNotFoundError(self._model_not_found_message(model_path))
            checkpoint = load_checkpoint(model_path)
            state_dict = checkpoint["state_dict"]
            class_dependent = self.get_class_dependent_keys(name)
            for key in class_dependent:
                state_dict.pop(key, None)
            loaded_epoch = checkpoint["epoch"]
            val_result = checkpoint.get("val_result")
            details = f"epoch = {loaded_epoch}"
            if val_result is not None:
                details += f", val_result = {val_result:.1f}"
            print(f'Loading weights to {name} from "{model_path}" ({details})')
            self._load_state_dict_reporting(name, state_dict, set(class_dependent))
            self.weights_epoch = loaded_epoch

    @staticmethod
    def _model_not_found_message(model_path):
        folder = osp.dirname(model_path)
        if not osp.isdir(folder):
            return f'Model not found at "{model_path}" (the folder "{folder}" does not exist; check --model-dir)'
        available = _epoch_checkpoint_files(folder)
        if available:
            found = f"model.pth.tar-N files in that folder: {', '.join(available)}; pick one with --load-epoch N"
        else:
            found = "that folder holds no model.pth.tar-N file"
        if osp.isfile(osp.join(folder, "model-best.pth.tar")):
            found += "; model-best.pth.tar is there too (loaded when --load-epoch is omitted)"
        return f'Model not found at "{model_path}" ({found})'

    def _load_state_dict_reporting(self, name, state_dict, intentionally_absent):
        """Load non-strictly into model ``name``; print unexpected keys and unintentionally missing keys."""
        model = _unwrap(self._models[name])
        result = model.load_state_dict(state_dict, strict=False)
        expected_absent = intentionally_absent | _frozen_parameter_names(model)
        missing = [key for key in result.missing_keys if key not in expected_absent]
        if result.unexpected_keys:
            print(f"Warning: keys in the checkpoint that {name} does not have (ignored): {result.unexpected_keys}")
        if missing:
            print(f"Warning: keys of {name} missing from the checkpoint (current values kept): {missing}")


class SimpleTrainer(TrainerBase):
    """Trainer built from a config: data, model, evaluator; training, testing, results file.

    Constructor order (trainers rely on it): ``validate_cfg(cfg)`` (the core keys) and
    ``check_cfg(cfg)`` (``self.cfg`` not yet set), both before any data is read; device,
    epochs / output dir / cfg / precision, ``build_data_loader()`` (labels checked),
    ``build_model()``, evaluator, ``best_result``. After ``build_model()`` the GradScaler is
    dropped if a registered optimizer holds half-precision parameters (reference-style fp16 trainers).

    Image files are checked (DATASET.CHECK_IMAGES) before training for the splits a training
    run reads, and before the first evaluation of a split otherwise; ``skipped_images`` counts
    the files left out with DATASET.SKIP_BAD_IMAGES.
    """

    def __init__(self, cfg):
        super().__init__()
        validate_cfg(cfg)
        self.check_cfg(cfg)
        use_cuda = torch.cuda.is_available() and cfg.USE_CUDA
        self.device = torch.device("cuda") if use_cuda else torch.device("cpu")
        self.start_epoch = self.epoch = 0
        self.max_epoch = cfg.OPTIM.MAX_EPOCH
        self.output_dir = cfg.OUTPUT_DIR
        self.cfg = cfg
        self.save_frozen_weights = cfg.TRAIN.SAVE_FROZEN_WEIGHTS
        self.amp = MixedPrecision(resolve_precision(cfg), self.device)
        self.prec = self.amp.prec
        self.last_test = None
        self._val_warning_printed = False
        self.nonfinite_loss = cfg.TRAIN.NONFINITE_LOSS
        self.skipped_images = {"train": 0, "val": 0, "test": 0}
        self._checked_splits = set()
        self._mid_epoch_notice_printed = False
        self.build_data_loader()
        self.build_model()
        self.amp.drop_scaler_for_half_parameters([optim for optim in self._optims.values() if optim is not None])
        self.evaluator = build_evaluator(cfg, lab2cname=self.lab2cname)
        self.best_result = -np.inf

    def check_cfg(self, cfg):
        """Hook to validate trainer-specific config keys (e.g. PREC); called before ``self.cfg`` is set."""

    def build_data_loader(self):
        """Build the DataManager, check the labels, and expose its loaders, ``num_classes``, ``lab2cname`` and ``dm``."""
        dm = DataManager(self.cfg)
        check_labels(dm.dataset)
        self.train_loader_x = dm.train_loader_x
        self.train_loader_u = dm.train_loader_u
        self.val_loader = dm.val_loader
        self.test_loader = dm.test_loader
        self.num_classes = dm.num_classes
        self.num_source_domains = dm.num_source_domains
        self.lab2cname = dm.lab2cname
        self.dm = dm

    def build_model(self):
        raise NotImplementedError(
            f"{type(self).__name__} must override build_model(): build self.model, its optimizer "
            "(build_optimizer) and scheduler (build_lr_scheduler), and call self.register_model(name, model, optim, sched)"
        )

    def train(self):
        check_training_cfg(self.cfg)
        super().train(self.start_epoch, self.max_epoch)

    def get_trainer_state(self):
        return {"best_result": float(self.best_result), "nonfinite_steps": self.nonfinite_steps}

    def set_trainer_state(self, state):
        if "best_result" in state:
            self.best_result = state["best_result"]
        self.nonfinite_steps = state.get("nonfinite_steps", 0)

    def check_images(self, splits):
        """Check the image files of ``splits`` (names among "train", "val", "test") not checked yet.

        Unreadable files raise BadImagesError, or with DATASET.SKIP_BAD_IMAGES are left out of
        their list (the loaders read the same lists) and counted in ``skipped_images``.
        """
        lists = {"train": self.dm.dataset.train_x, "val": self.dm.dataset.val, "test": self.dm.dataset.test}
        todo = {split: lists[split] for split in splits if split not in self._checked_splits and lists[split]}
        counts = check_images(
            todo, self.cfg.DATASET.CHECK_IMAGES, skip=self.cfg.DATASET.SKIP_BAD_IMAGES, report_dir=self.output_dir
        )
        self._checked_splits.update(todo)
        self.skipped_images.update({split: count for split, count in counts.items() if count})
        if counts.get("train"):
            check_labels(self.dm.dataset)
            if len(self.train_loader_x) == 0:
                raise DatasetContentError(
                    f"After leaving out {counts['train']} unreadable image(s), the training set has "
                    f"{len(self.dm.dataset.train_x)} image(s), fewer than a batch "
                    f"(DATALOADER.TRAIN_X.BATCH_SIZE {self.cfg.DATALOADER.TRAIN_X.BATCH_SIZE})."
                )

    def before_train(self):
        self.check_images(["train"] if self.cfg.TEST.NO_TEST else ["train", "val", "test"])
        directory = self.cfg.RESUME if self.cfg.RESUME else self.cfg.OUTPUT_DIR
        self.start_epoch = self.resume_model_if_exist(directory)
        writer_dir = osp.join(self.output_dir, "tensorboard")
        mkdir_if_missing(writer_dir)
        self.init_writer(writer_dir)
        self.time_start = time.time()

    def after_epoch(self):
        """Select on val with FINAL_MODEL best_val; save every CHECKPOINT_FREQ epochs and after the last one."""
        last_epoch = (self.epoch + 1) == self.max_epoch
        checkpoint_freq = self.cfg.TRAIN.CHECKPOINT_FREQ
        meet_checkpoint_freq = checkpoint_freq > 0 and (self.epoch + 1) % checkpoint_freq == 0
        if not self.cfg.TEST.NO_TEST and self.cfg.TEST.FINAL_MODEL == "best_val":
            curr_result = self.test(split="val")
            if curr_result > self.best_result:
                self.best_result = curr_result
                self.save_model(self.epoch, self.output_dir, val_result=curr_result, model_name="model-best.pth.tar")
        if meet_checkpoint_freq or last_epoch:
            self.save_model(self.epoch, self.output_dir)

    def after_train(self):
        for name in self.get_model_names():  # the final checkpoint supersedes the mid-epoch ones
            prune_mid_epoch_checkpoints(osp.join(self.output_dir, name), keep=0)
        print("Finish training")
        if not self.cfg.TEST.NO_TEST:
            if self.cfg.TEST.FINAL_MODEL == "best_val":
                print("Deploy the model with the best val performance")
                self.load_model(self.output_dir)
            else:
                print("Deploy the last-epoch model")
            self.test()
            self.save_results()
        elapsed = round(time.time() - self.time_start)
        print(f"Elapsed: {datetime.timedelta(seconds=elapsed)}")
        self.close_writer()

    def _eval_loader(self, split):
        """(split actually used, loader): "val" falls back to "test" when there is no val split."""
        if split == "val" and self.val_loader is not None:
            if self.dm.dataset.val is self.dm.dataset.test and not self._val_warning_printed:
                print("Warning: this dataset's val split is its test split (e.g. ImageNet): evaluating on *val* uses the test images")
                self._val_warning_printed = True
            return "val", self.val_loader
        if split == "val" and not self._val_warning_printed:
            print(
                "Warning: the dataset has no val split, so the *test* set is evaluated instead "
                "(with TEST.FINAL_MODEL best_val the model is then selected on test data)"
            )
            self._val_warning_printed = True
        return "test", self.test_loader

    @torch.no_grad()
    def test(self, split=None):
        """Evaluate on ``split`` (default TEST.SPLIT) and return the first metric (accuracy).

        The full result is kept in ``self.last_test`` ({"split", "metrics", "num_samples"}).
        """
        self.set_model_mode("eval")
        self.evaluator.reset()
        split, data_loader = self._eval_loader(self.cfg.TEST.SPLIT if split is None else split)
        self.check_images([split])
        print(f"Evaluate on the *{split}* set")
        num_samples = 0
        for batch in tqdm(data_loader):
            input, label = self.parse_batch_test(batch)
            output = self.model_inference(input)
            self.evaluator.process(output, label)
            num_samples += label.shape[0]
        results = self.evaluator.evaluate()
        for key, value in results.items():
            self.write_scalar(f"{split}/{key}", value, self.epoch)
        self.last_test = {"split": split, "metrics": dict(results), "num_samples": num_samples}
        return list(results.values())[0]

    def save_results(self):
        """Write ``OUTPUT_DIR/results.json`` for the last ``test()`` and return its path."""
        if self.last_test is None:
            raise RuntimeError("save_results() records the last test() result, but test() has not run yet")
        record = make_results_record(
            self.cfg,
            self.run_info,
            split=self.last_test["split"],
            metrics=self.last_test["metrics"],
            num_classes=self.num_classes,
            num_test=self.last_test["num_samples"],
            epoch=self.weights_epoch,
            wall_time_s=time.time() - self.time_created,
            skipped_images=self.skipped_images,
            skipped_nonfinite_steps=self.nonfinite_steps,
        )
        path = write_results(record, self.output_dir)
        print(f"Results saved to {path}")
        return path

    def model_inference(self, input):
        with self.autocast():
            return self.model(input)

    def parse_batch_test(self, batch):
        return batch["img"].to(self.device), batch["label"].to(self.device)

    def get_current_lr(self, names=None):
        """Learning rate of param group 0 of the first (or first given) model's optimizer."""
        name = self.get_model_names(names)[0]
        return self._optims[name].param_groups[0]["lr"]


class TrainerX(SimpleTrainer):
    """Trainer over labelled data only (``train_loader_x``).

    Scheduler stepping contract: the engine never steps schedulers. ``forward_backward`` calls
    ``self.update_lr()`` when ``self.batch_idx + 1 == self.num_batches`` (once per epoch, after
    the optimizer step of the last batch); ``batch_idx`` and ``num_batches`` are set before it runs.

    Mid-epoch checkpoints: every TRAIN.CHECKPOINT_ITERS iterations (counted over the whole run;
    not at the last batch of an epoch, which the epoch-end logic handles) every model is saved
    with the data position. They need a resumable sampler in the training loader (those of
    :mod:`vlprompt.data.samplers`); the meters of a resumed epoch restart, so its printed
    running averages cover the batches run since the resume.
    """

    def run_epoch(self):
        self.set_model_mode("train")
        losses = MetricMeter()
        batch_time = AverageMeter()
        data_time = AverageMeter()
        self.num_batches = len(self.train_loader_x)
        print_freq = self.cfg.TRAIN.PRINT_FREQ
        batches, first_batch = self._epoch_batches()

        end = time.time()
        for self.batch_idx, batch in enumerate(batches, start=first_batch):
            data_time.update(time.time() - end)
            loss_summary = self.forward_backward(batch)
            batch_time.update(time.time() - end)
            losses.update(loss_summary)

            if (self.batch_idx + 1) % print_freq == 0 or self.num_batches < print_freq:
                batches_left = self.num_batches - self.batch_idx - 1
                batches_left += (self.max_epoch - self.epoch - 1) * self.num_batches
                eta = datetime.timedelta(seconds=int(batch_time.avg * batches_left))
                print(
                    f"epoch [{self.epoch + 1}/{self.max_epoch}] "
                    f"batch [{self.batch_idx + 1}/{self.num_batches}] "
                    f"time {batch_time.val:.3f} ({batch_time.avg:.3f}) "
                    f"data {data_time.val:.3f} ({data_time.avg:.3f}) "
                    f"{losses} "
                    f"lr {self.get_current_lr():.4e} "
                    f"eta {eta}"
                )

            n_iter = self.epoch * self.num_batches + self.batch_idx
            for name, meter in losses.meters.items():
                self.write_scalar("train/" + name, meter.avg, n_iter)
            self.write_scalar("train/lr", self.get_current_lr(), n_iter)
            self._save_mid_epoch_if_due()
            end = time.time()

    def _resumable_sampler(self):
        """The training loader's resumable sampler, or None (e.g. a trainer's own loader)."""
        sampler = getattr(self.train_loader_x, "sampler", None)
        return sampler if hasattr(sampler, "resume_epoch") and self.train_loader_x.batch_size else None

    def _epoch_batches(self):
        """(iterator over this epoch's training batches, index of its first batch).

        After resuming from a mid-epoch checkpoint: the batches the interrupted epoch had not
        run yet, with the RNG states of the checkpoint (restored again after the loader's
        iterator is created, since creating it draws from torch's generator).
        """
        pending, self._pending_mid_epoch = self._pending_mid_epoch, None
        if pending is None:
            return iter(self.train_loader_x), 0
        sampler = self._resumable_sampler()
        if sampler is None or pending["num_batches"] != self.num_batches:
            raise CheckpointError(
                f"The mid-epoch checkpoint \"{self.last_checkpoint}\" cannot continue this epoch: "
                + ("the training loader cannot resume mid-epoch (its sampler is not resumable)" if sampler is None
                   else f"it was written for {pending['num_batches']} batches per epoch, the loader now has "
                   f"{self.num_batches} (did the training data or the batch size change?)")
                + ". Delete the mid-epoch checkpoints (model.pth.tar-E-batchB) to resume from the last epoch."
            )
        sampler.resume_epoch(pending["sampler"], pending["batches_done"] * self.train_loader_x.batch_size)
        batches = iter(self.train_loader_x)
        if pending["rng_state"] is not None:
            set_rng_state(pending["rng_state"])
        return batches, pending["batches_done"]

    def _save_mid_epoch_if_due(self):
        """Save a mid-epoch checkpoint every TRAIN.CHECKPOINT_ITERS iterations (see the class docstring)."""
        interval = self.cfg.TRAIN.CHECKPOINT_ITERS
        done = self.epoch * self.num_batches + self.batch_idx + 1
        if interval <= 0 or done % interval != 0 or self.batch_idx + 1 == self.num_batches:
            return
        sampler = self._resumable_sampler()
        if sampler is None:
            if not self._mid_epoch_notice_printed:
                print("Note: TRAIN.CHECKPOINT_ITERS is set, but the training loader cannot resume mid-epoch: "
                      "only epoch checkpoints are written")
                self._mid_epoch_notice_printed = True
            return
        position = {"num_batches": self.num_batches, "sampler": sampler.state_dict()}
        self.save_mid_epoch_model(self.output_dir, self.batch_idx + 1, position)

    def parse_batch_train(self, batch):
        """(images, labels, domains) moved to the device."""
        return batch["img"].to(self.device), batch["label"].to(self.device), batch["domain"].to(self.device)
