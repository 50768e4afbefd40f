"""Trainer lifecycle with Dassl's names: ``TrainerBase``, ``SimpleTrainer``, ``TrainerX`` (engine spec §5).

What CoOp-family trainers rely on (constructor order, hooks, log lines, checkpoint layout) follows
Dassl 0.6.3. Our additions ([decision]s of the spec and the lead's brief):

* precision: ``self.prec``, ``self.autocast()`` and a GradScaler inside ``model_backward_and_update``
  (see :mod:`vlprompt.engine.amp`);
* checkpoints also hold "rng_state", "scaler" and "trainer_state", drop frozen parameters unless
  ``TRAIN.SAVE_FROZEN_WEIGHTS``, and resuming is exact (highest ``model.pth.tar-N``, RNG restored);
* ``load_model`` is the CoOp-family override generalised (class-dependent keys via
  ``get_class_dependent_keys``, non-strict loading with a report);
* ``results.json`` after every final evaluation (see :mod:`vlprompt.engine.results`).
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

from vlprompt.data import DataManager
from vlprompt.evaluation import build_evaluator
from vlprompt.utils import (
    AverageMeter,
    MetricMeter,
    get_rng_state,
    load_checkpoint,
    mkdir_if_missing,
    resume_from_checkpoint,
    save_checkpoint,
    tolist_if_not,
)

from .amp import MixedPrecision, resolve_precision
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


def _epoch_checkpoint_files(folder: str) -> list:
    """Names of the ``model.pth.tar-N`` files in ``folder``, by increasing N ([] if the folder is missing)."""
    if not osp.isdir(folder):
        return []
    names = [name for name in os.listdir(folder) if _EPOCH_FILE_PATTERN.match(name)]
    return sorted(names, key=lambda name: int(_EPOCH_FILE_PATTERN.match(name).group(1)))


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

    def detect_anomaly(self, loss):
        """Raise FloatingPointError if any element of ``loss`` is infinite or NaN."""
        if not torch.isfinite(loss).all():
            raise FloatingPointError("Loss is infinite or NaN!")

    def model_zero_grad(self, names=None):
        for name in self.get_model_names(names):
            if self._optims[name] is not None:
                self._optims[name].zero_grad()

    def model_backward(self, loss):
        """Check ``loss`` for inf/NaN, then back-propagate it (scaled when a GradScaler is active)."""
        self.detect_anomaly(loss)
        self.amp.backward(loss)

    def model_update(self, names=None):
        """Step the optimizer of each (given) model (through the GradScaler when active)."""
        optims = [self._optims[name] for name in self.get_model_names(names)]
        self.amp.step([optim for optim in optims if optim is not None])

    def model_backward_and_update(self, loss, names=None):
        """zero_grad, backward and optimizer step for the (given) models."""
        self.model_zero_grad(names)
        self.model_backward(loss)
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
        for name in self.get_model_names():
            model = _unwrap(self._models[name])
            state_dict = model.state_dict()
            if not self.save_frozen_weights:
                frozen = _frozen_parameter_names(model)
                state_dict = OrderedDict((key, value) for key, value in state_dict.items() if key not in frozen)
            optim, sched = self._optims[name], self._scheds[name]
            save_checkpoint(
                {
                    "state_dict": state_dict,
                    "epoch": epoch + 1,
                    "optimizer": None if optim is None else optim.state_dict(),
                    "scheduler": None if sched is None else sched.state_dict(),
                    "val_result": val_result,
                    "rng_state": get_rng_state(),
                    "scaler": self.amp.state_dict(),
                    "trainer_state": self.get_trainer_state(),
                },
                osp.join(directory, name),
                is_best=is_best,
                model_name=model_name,
            )

    def resume_model_if_exist(self, directory):
        """Resume every registered model from ``directory/<name>/`` if checkpoints exist there.

        Loads weights, optimizer, scheduler and RNG states of the highest ``model.pth.tar-N``
        (``resume_from_checkpoint``), then the scaler and trainer state of that epoch, and
        prints a banner.

        Returns:
            int: the epoch index to continue from (0 when nothing was found).
        """
        names = self.get_model_names()
        if not names or any(not osp.isdir(osp.join(directory, name)) for name in names):
            print("No checkpoint found, train from scratch")
            return 0
        print(f"Found checkpoint at {directory} (will resume training)")
        epochs = {
            name: resume_from_checkpoint(
                osp.join(directory, name), self._models[name], self._optims[name], self._scheds[name]
            )
            for name in names
        }
        if len(set(epochs.values())) > 1:
            raise RuntimeError(
                f'The checkpoints in "{directory}" stop at different epochs per model ({epochs}), '
                "e.g. after a run was killed while saving; delete the newer files so that all models "
                "end at the same epoch, or start a fresh run with another --output-dir."
            )
        start_epoch = epochs[names[0]]
        extras_path = osp.join(directory, names[0], f"model.pth.tar-{start_epoch}")
        if osp.isfile(extras_path):
            extras = load_checkpoint(extras_path)
            self.amp.load_state_dict(extras.get("scaler"))
            self.set_trainer_state(extras.get("trainer_state") or {})
        else:
            print(f'Note: "{extras_path}" does not exist, so the gradient scaler and trainer state start fresh')
        self.weights_epoch = start_epoch
        self._print_resume_banner(directory, start_epoch)
        return start_epoch

    def _print_resume_banner(self, directory, start_epoch):
        if start_epoch >= self.max_epoch:
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

    Constructor order (trainers rely on it): ``check_cfg(cfg)`` (``self.cfg`` not yet set), device,
    epochs / output dir / cfg / precision, ``build_data_loader()``, ``build_model()``, evaluator,
    ``best_result``. After ``build_model()`` the GradScaler is dropped if a registered optimizer
    holds half-precision parameters (reference-style fp16 trainers).
    """

    def __init__(self, cfg):
        super().__init__()
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
        self.build_data_loader()
        self.build_model()
        self.amp.drop_scaler_for_half_parameters([optim for optim in self._optims.values() if optim is not None])
        self.evaluator = build_evaluator(cfg, lab2cname=self.lab2cname)
        self.best_result = -np.inf

    def check_cfg(self, cfg):
        """Hook to validate trainer-specific config keys (e.g. PREC); called before ``self.cfg`` is set."""

    def build_data_loader(self):
        """Build the DataManager and expose its loaders, ``num_classes``, ``lab2cname`` and ``dm``."""
        dm = DataManager(self.cfg)
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
        super().train(self.start_epoch, self.max_epoch)

    def get_trainer_state(self):
        return {"best_result": float(self.best_result)}

    def set_trainer_state(self, state):
        if "best_result" in state:
            self.best_result = state["best_result"]

    def before_train(self):
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
    """

    def run_epoch(self):
        self.set_model_mode("train")
        losses = MetricMeter()
        batch_time = AverageMeter()
        data_time = AverageMeter()
        self.num_batches = len(self.train_loader_x)
        print_freq = self.cfg.TRAIN.PRINT_FREQ

        end = time.time()
        for self.batch_idx, batch in enumerate(self.train_loader_x):
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
            end = time.time()

    def parse_batch_train(self, batch):
        """(images, labels, domains) moved to the device."""
        return batch["img"].to(self.device), batch["label"].to(self.device), batch["domain"].to(self.device)
