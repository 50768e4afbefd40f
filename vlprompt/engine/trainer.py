"""Trainer lifecycle with Dassl's names: ``TrainerBase``, ``SimpleTrainer``, ``TrainerX``.

What CoOp-family trainers rely on (constructor order, the lifecycle methods, log lines,
checkpoint layout) follows Dassl 0.6.3. The trainer is assembled from one module per concern:

* :mod:`.steps`: the optimisation step (autocast, inf/NaN check, backward, update, ``update_lr``);
* :mod:`.checkpointing`: saving, exact resuming, ``load_model``, and the checkpoint policy hook;
* :mod:`.evaluation`: ``test``, ``results.json``, and the test after training;
* :mod:`.progress`: progress lines, tensorboard scalars, elapsed time;
* :mod:`.hooks`: how behaviour attaches to ``before_train`` / ``before_epoch`` / ``after_step``
  / ``after_epoch`` / ``after_train``.

This module holds the lifecycle itself: the model registry, the epoch loop, the construction
of a trainer from a config (data, model, evaluator, default hooks) and the batch loop of
``TrainerX``. The lifecycle methods ``before_train``, ``before_epoch``, ``after_epoch`` and
``after_train`` call the registered hooks, so a trainer that overrides one of them calls
``super()`` to keep the engine's behaviour at that point (as with Dassl's SimpleTrainer).

Our additions to Dassl: precision through
``self.amp``; checkpoints with RNG, scaler and trainer state, exact (also mid-epoch) resuming;
``load_model`` as the CoOp-family override generalised; ``results.json`` after every final
evaluation; image and label checks before training; non-finite losses that stop the run with
the step and the loss terms (TRAIN.NONFINITE_LOSS).
"""
import time
from collections import OrderedDict

import numpy as np
import torch

from vlprompt.config import ConfigError, check_choice
from vlprompt.clip.preprocess import resolved_input
from vlprompt.data import DataManager, stop_loader_workers
from vlprompt.data.checks import DatasetContentError, check_images, check_labels
from vlprompt.evaluation import build_evaluator
from vlprompt.utils import AverageMeter, MetricMeter, tolist_if_not

from .amp import PRECISIONS, MixedPrecision, precision_key, resolve_precision
from .build import TRAINER_REGISTRY
from .checkpointing import CheckpointHook, CheckpointingMixin
from .compilation import compile_step_methods, mark_step
from .config_checks import check_training_cfg, validate_cfg
from .evaluation import EvaluationMixin, FinalEvaluationHook
from .hooks import HookBase, call_hooks
from .progress import LoggingHook, WriterMixin
from .results import RUN_INFO_DEFAULTS
from .source_run import check_model_dir
from .steps import NonFiniteLossError, OptimizationMixin

__all__ = ["NonFiniteLossError", "SimpleTrainer", "TrainerBase", "TrainerX"]


class TrainerBase(OptimizationMixin, CheckpointingMixin, WriterMixin):
    """Model registry, hooks and the epoch loop, independent of data.

    Attributes:
        _models, _optims, _scheds (OrderedDict): registered modules and their optimizer and
            scheduler (either may be None), keyed by model name (= checkpoint sub-folder).
        amp (MixedPrecision): autocast and gradient scaling (fp32 until a subclass sets it).
        run_info (dict): facts of the run that are not in the config, filled by train.py
            (keys of ``vlprompt.engine.results.RUN_INFO_DEFAULTS``).
        time_created (float): ``time.time()`` when the trainer was created.
        hooks (list of HookBase): called by the lifecycle methods, in order (``register_hooks``).

    The optimisation, checkpoint and writer methods and their attributes are documented in
    :mod:`.steps`, :mod:`.checkpointing` and :mod:`.progress`.
    """

    def __init__(self):
        self._models = OrderedDict()
        self._optims = OrderedDict()
        self._scheds = OrderedDict()
        super().__init__()
        self.amp = MixedPrecision("fp32", torch.device("cpu"))
        self.compile_mode = None  # torch.compile's mode of the step methods (SimpleTrainer.compile_model)
        self.run_info = dict(RUN_INFO_DEFAULTS)
        self.time_created = time.time()
        self.hooks = []

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

    # ----------------------------------------------------------------------------------------
    # Hooks and the epoch loop
    # ----------------------------------------------------------------------------------------
    def register_hooks(self, hooks):
        """Append ``hooks`` (HookBase instances) to the hooks the lifecycle methods call."""
        for hook in hooks:
            if not isinstance(hook, HookBase):
                raise TypeError(f"A hook must be an instance of a HookBase subclass, got {type(hook).__name__}")
        self.hooks.extend(hooks)

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
        call_hooks(self.hooks, "before_train", self)

    def after_train(self):
        call_hooks(self.hooks, "after_train", self)

    def before_epoch(self):
        call_hooks(self.hooks, "before_epoch", self)

    def after_epoch(self):
        call_hooks(self.hooks, "after_epoch", self)

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


class SimpleTrainer(EvaluationMixin, TrainerBase):
    """Trainer built from a config: data, model, evaluator, default hooks; testing, results file.

    Constructor order (trainers rely on it): ``validate_cfg(cfg)`` (the core keys), the empty
    INPUT preprocessing keys resolved from the backbone (a resolved copy of ``cfg`` becomes
    ``self.cfg``; :mod:`vlprompt.clip.preprocess`), ``check_declared_cfg(cfg)`` (what the class declares, e.g. ``precisions``) and
    ``check_cfg(cfg)`` (``self.cfg`` not yet set), all before any data is read; device,
    epochs / output dir / cfg / precision, ``build_data_loader()`` (labels checked),
    ``build_model()``, ``compile_model(TRAIN.COMPILE)``, evaluator, ``best_result``,
    ``register_hooks(build_hooks())``. After ``build_model()`` the GradScaler is dropped if a
    registered optimizer holds half-precision parameters (reference-style fp16 trainers).

    Lifecycle: ``before_train`` checks the image files of the splits the run reads, then calls
    the hooks; ``after_train`` prints "Finish training", then calls the hooks. The default
    hooks (``build_hooks``) are, in order, :class:`CheckpointHook` (resume; best-on-val,
    periodic and mid-epoch checkpoints), :class:`FinalEvaluationHook` (deploy, test,
    results.json) and :class:`LoggingHook` (tensorboard writer, "Elapsed: ...").

    Image files are checked (DATASET.CHECK_IMAGES) before training for the splits a training
    run reads, and before the first evaluation of a split otherwise; ``skipped_images`` counts
    the files left out with DATASET.SKIP_BAD_IMAGES.
    """

    # The values of TRAINER.<TRAINER.NAME upper-cased>.PREC this trainer accepts (a trainer whose
    # node has no PREC runs in fp32); check_declared_cfg refuses any other.
    precisions = PRECISIONS
    # Why the method cannot score class names it was not trained on ("" = it can: its classifier is
    # built from the class names, as base-to-novel's new classes); vlprompt_app.predict refuses
    # other class names with this reason.
    unseen_classes_refusal = ""
    # The cost benchmark's cases of this trainer (vlprompt.engine.benchmark_case.Case); every trainer
    # of trainers/ declares its own in its class body (the application collects them from the registry).
    benchmark_cases = ()
    # TRAIN.COMPILE (vlprompt/engine/compilation.py): why this trainer's step cannot be traced into
    # one graph ("" = it can: tests/test_compile.py checks every benchmark case's step for graph
    # breaks unless this is set), and why the trainer refuses TRAIN.COMPILE ("" = it does not).
    compile_graph_breaks = ""
    compile_refusal = ""

    def __init__(self, cfg):
        super().__init__()
        validate_cfg(cfg)
        cfg = resolved_input(cfg)  # a resolved config (train.py's) is kept as it is
        self.check_declared_cfg(cfg)
        self.check_cfg(cfg)
        use_cuda = torch.cuda.is_available() and cfg.USE_CUDA
        self.device = torch.device("cuda") if use_cuda else torch.device("cpu")
        self.start_epoch = self.epoch = 0
        self.max_epoch = self.training_epochs(cfg)
        self.output_dir = cfg.OUTPUT_DIR
        self.cfg = cfg
        self.save_frozen_weights = cfg.TRAIN.SAVE_FROZEN_WEIGHTS
        self.amp = MixedPrecision(resolve_precision(cfg), self.device, cfg.TRAIN.CPU_AUTOCAST)
        self.prec = self.amp.prec
        self.nonfinite_loss = cfg.TRAIN.NONFINITE_LOSS
        self.skipped_images = {"train": 0, "val": 0, "test": 0}
        self._checked_splits = set()
        self.build_data_loader()
        self.build_model()
        self.compile_mode = self.compile_model(cfg.TRAIN.COMPILE)
        self.amp.drop_scaler_for_half_parameters([optim for optim in self._optims.values() if optim is not None])
        self.evaluator = build_evaluator(cfg, lab2cname=self.lab2cname)
        self.best_result = -np.inf
        self.register_hooks(self.build_hooks())

    @classmethod
    def check_declared_cfg(cls, cfg):
        """Check what the class declares (subclasses extend it, calling super): the precision
        (``TRAINER.<NAME>.PREC``, where the trainer's node has one) must be one of ``precisions``,
        and TRAIN.COMPILE must be empty for a trainer with a ``compile_refusal``.

        Raises:
            ConfigError: naming the key, the allowed values and the value given.
        """
        key = precision_key(cfg)
        if key is not None:
            check_choice(key, resolve_precision(cfg), cls.precisions)
        if cfg.TRAIN.COMPILE and cls.compile_refusal:
            raise ConfigError(f"TRAIN.COMPILE is {cfg.TRAIN.COMPILE!r}, but {cfg.TRAINER.NAME} does not compile: "
                              f"{cls.compile_refusal}. Leave TRAIN.COMPILE empty.")

    def check_cfg(self, cfg):
        """Hook to validate trainer-specific config keys; called after ``check_declared_cfg`` and
        before ``self.cfg`` is set."""

    @classmethod
    def preflight(cls, cfg, training, model_dir):
        """Checks of files named by the config or the command line that need neither data nor a
        model; train.py runs them before the trainer is built (before any data or CLIP loads).

        Args:
            cfg: the run's config. training: whether the run trains.
            model_dir: the folder an ``--eval-only`` run loads ("" for none).

        Returns:
            lines to print in the run's log (the default: the trainer of ``model_dir``).

        Raises:
            ConfigError: naming the file and what is wrong (the default: see
                :func:`vlprompt.engine.source_run.check_model_dir`).
        """
        return [check_model_dir(cfg, model_dir, TRAINER_REGISTRY)] if model_dir else []

    @classmethod
    def source_trainers(cls, cfg):
        """The trainers whose runs ``--model-dir`` may name with ``cfg`` (a tuple of names; runs of
        their subclasses too), or None for any (the default)."""
        return None

    @classmethod
    def training_epochs(cls, cfg):
        """Number of epochs a training run with ``cfg`` trains (``max_epoch``; the number of its last
        checkpoint): OPTIM.MAX_EPOCH, unless a trainer derives it from the config (e.g. per dataset).
        The protocol runner loads that checkpoint for evaluation."""
        return cfg.OPTIM.MAX_EPOCH

    def training_transform(self):
        """The training loader's transform in place of the one INPUT.TRANSFORMS builds, or None (default)."""
        return None

    def build_data_loader(self):
        """Build the DataManager, check the labels, and expose its loaders, ``num_classes``, ``lab2cname`` and ``dm``."""
        dm = DataManager(self.cfg, custom_tfm_train=self.training_transform())
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

    def compile_model(self, backend, fullgraph=False):
        """With a TRAIN.COMPILE ``backend`` (not ""), compile the step methods of ``self.model``
        (:mod:`.compilation`; ``fullgraph``: a graph break raises) and print what was compiled;
        returns torch.compile's mode (None: the default, or nothing compiled)."""
        if not backend:
            return None
        names, mode = compile_step_methods(self.model, backend, self.device, fullgraph)
        model = type(self.model).__name__
        breaks = f"; graph breaks expected: {self.compile_graph_breaks}" if self.compile_graph_breaks else ""
        print(f"TRAIN.COMPILE: torch.compile (backend {backend}, mode {mode or 'default'}) of "
              f"{', '.join(f'{model}.{name}' for name in names)}{breaks}")
        return mode

    def build_hooks(self):
        """The hooks of this trainer, in calling order (override to add or replace hooks)."""
        return [CheckpointHook(), FinalEvaluationHook(), LoggingHook()]

    def train(self):
        check_training_cfg(self.cfg)
        if self.dm.dataset.prediction_map is not None:
            raise ConfigError(
                f"{self.cfg.DATASET.NAME} is a test set whose images are scored through another dataset's classes "
                f"({len(self.dm.dataset.prediction_map.classnames)} of them), so it cannot be trained on: evaluate a "
                "model trained on that dataset with --eval-only --model-dir DIR."
            )
        try:
            super().train(self.start_epoch, self.max_epoch)
        finally:  # also when training raises (a bad checkpoint, a non-finite loss, an interrupt)
            for loader in (self.train_loader_x, self.train_loader_u):
                stop_loader_workers(loader)

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
        self.check_images(["train"] if self.cfg.TEST.NO_TEST else ["train", *self._evaluated_splits()])
        super().before_train()

    def _evaluated_splits(self):
        """The splits a training run may evaluate: "val" (best-on-val selection, TEST.SPLIT val) and
        "test", unless TEST.SPLIT is "val" and the dataset has a val split (evaluating "val" falls
        back to "test" without one): then the test images are never read."""
        if self.cfg.TEST.SPLIT == "val" and self.val_loader is not None:
            return ["val"]
        return ["val", "test"]

    def after_train(self):
        print("Finish training")
        super().after_train()

    def get_current_lr(self, names=None):
        """Learning rate of param group 0 of the first (or first given) model's optimizer."""
        name = self.get_model_names(names)[0]
        return self._optims[name].param_groups[0]["lr"]


class TrainerX(SimpleTrainer):
    """Trainer over labelled data only (``train_loader_x``).

    Scheduler stepping contract: the engine never steps schedulers. ``forward_backward`` calls
    ``self.update_lr()`` when ``self.batch_idx + 1 == self.num_batches`` (once per epoch, after
    the optimizer step of the last batch); ``batch_idx`` and ``num_batches`` are set before it runs.

    Every step: ``forward_backward(batch)`` -> loss summary (dict of floats or 0-dim tensors,
    read only when logged, so reporting them makes no other step wait for the device), the
    progress line when due and the scalars (:mod:`.progress`), then the hooks' ``after_step``
    (mid-epoch checkpoints every TRAIN.CHECKPOINT_ITERS steps, :mod:`.checkpointing`). Batch
    and data times exclude the hooks. After resuming from a mid-epoch checkpoint the epoch
    continues with the batches it had not run; the meters of a resumed epoch restart, so its
    printed running averages cover the batches run since the resume.
    """

    def run_epoch(self):
        self.set_model_mode("train")
        losses = MetricMeter()
        batch_time = AverageMeter()
        data_time = AverageMeter()
        self.num_batches = len(self.train_loader_x)
        batches, first_batch = self.epoch_batches(self.train_loader_x, self.num_batches)

        end = time.time()
        for self.batch_idx, batch in enumerate(batches, start=first_batch):
            data_time.update(time.time() - end)
            mark_step(self.compile_mode)
            loss_summary = self.forward_backward(batch)
            batch_time.update(time.time() - end)
            losses.update(loss_summary)
            self.log_training_step(losses, batch_time, data_time, self.cfg.TRAIN.PRINT_FREQ)
            call_hooks(self.hooks, "after_step", self)
            end = time.time()
        self.write_training_scalars(losses)  # the steps since the last progress line

    def parse_batch_train(self, batch):
        """(images, labels, domains) moved to the device."""
        return batch["img"].to(self.device), batch["label"].to(self.device), batch["domain"].to(self.device)
