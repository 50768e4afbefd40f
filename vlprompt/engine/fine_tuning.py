"""What the full fine-tuning trainers share (RAda's Table 1 setting: all of ImageNet, batch 512).

* the WiSE-FT learning-rate schedule: ``iteration_cosine_schedule`` (linear warm-up over
  WARMUP_ITERS iterations, then a per-iteration cosine to 0), chosen by a trainer node's
  LR_SCHEDULE "iteration" (or "epoch": OPTIM's per-epoch schedule), with
  ``check_iteration_schedule`` refusing OPTIM settings it would ignore;
* the zero-shot head's sentences: ``head_templates`` (CLIP's 80 ImageNet templates with
  TEMPLATE_ENSEMBLE, else the one TEMPLATE); ``add_fine_tuning_keys`` adds these four keys to a
  trainer node;
* ``FullFineTuningTrainer``: a ClipTrainer that runs as one process or under ``torchrun`` with
  DistributedDataParallel (the global batch split over the processes, files written by rank 0;
  vlprompt/engine/distributed.py), steps its schedule per iteration or per epoch, stores the
  class names in its checkpoints and, when loading, keeps the classifier rows of the current
  classes (``classifier_rows``), so a model trained on ImageNet evaluates on ImageNet-A/-R.
"""
import math
import os.path as osp

from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from vlprompt.clip import imagenet_templates
from vlprompt.clip.templates import DEFAULT_TEMPLATE, dataset_template
from vlprompt.config import ConfigError, check_choice, check_range
from vlprompt.optim import build_lr_scheduler
from vlprompt.utils import load_checkpoint

from .clip_trainer import ClipTrainer
from .distributed import distributed_train_loader, init_distributed, is_main_process, mean_over_processes
from .run_folder import RunFolder

__all__ = [
    "LR_SCHEDULES", "add_fine_tuning_keys", "iteration_cosine_schedule", "check_iteration_schedule",
    "head_templates", "classifier_rows", "FullFineTuningTrainer",
]

LR_SCHEDULES = ("iteration", "epoch")


def add_fine_tuning_keys(node):
    """Add the head-template and schedule keys (WiSE-FT's defaults) to a trainer node."""
    node.TEMPLATE = DEFAULT_TEMPLATE  # head sentence when TEMPLATE_ENSEMBLE is False ("" = dataset's)
    node.TEMPLATE_ENSEMBLE = True  # head from CLIP's 80 ImageNet templates (False: TEMPLATE)
    node.LR_SCHEDULE = "iteration"  # per-iteration warm-up + cosine (WiSE-FT; needs OPTIM.LR_SCHEDULER "cosine"
    # and OPTIM.WARMUP_EPOCH <= 0), or "epoch" (OPTIM.LR_SCHEDULER and OPTIM.WARMUP_*)
    node.WARMUP_ITERS = 500  # linear warm-up iterations of the "iteration" schedule


def iteration_cosine_schedule(optimizer, warmup, total):
    """LR x (i + 1) / warmup for iteration i < warmup, then a cosine from LR to 0 at ``total``."""

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return LambdaLR(optimizer, factor)


def check_iteration_schedule(optim, node_name):
    """Raise ConfigError when OPTIM asks for what the "iteration" schedule does not do: it is a
    per-iteration cosine (OPTIM.LR_SCHEDULER must be "cosine") after ``node_name``.WARMUP_ITERS
    linear warm-up iterations (OPTIM.WARMUP_EPOCH must be <= 0: OPTIM.WARMUP_* describe the
    epoch schedule's warm-up)."""
    other = f'or set {node_name}.LR_SCHEDULE "epoch" to use OPTIM\'s per-epoch schedule and warm-up'
    if optim.LR_SCHEDULER != "cosine":
        raise ConfigError(
            f'OPTIM.LR_SCHEDULER is "{optim.LR_SCHEDULER}", but {node_name}.LR_SCHEDULE "iteration" supports '
            f'only "cosine" (a per-iteration cosine after {node_name}.WARMUP_ITERS warm-up iterations): set '
            f'OPTIM.LR_SCHEDULER "cosine", {other}.'
        )
    if optim.WARMUP_EPOCH > 0:
        raise ConfigError(
            f"OPTIM.WARMUP_EPOCH is {optim.WARMUP_EPOCH}, but {node_name}.LR_SCHEDULE \"iteration\" warms up "
            f"linearly for {node_name}.WARMUP_ITERS iterations and reads no OPTIM.WARMUP_* key: set "
            f"OPTIM.WARMUP_EPOCH 0, {other}."
        )


def head_templates(node, dataset):
    """The sentences of the zero-shot head: CLIP's 80 ImageNet templates (node.TEMPLATE_ENSEMBLE),
    else [node.TEMPLATE] ("" = the dataset's own template)."""
    return imagenet_templates() if node.TEMPLATE_ENSEMBLE else [dataset_template(dataset, node.TEMPLATE)]


def classifier_rows(weight, stored_names, current, model_path):
    """The rows of a classifier ``weight`` [K, ...] trained on ``stored_names`` (K names) that
    score ``current``'s classes, in ``current``'s order (a name listed twice, as a few of
    ImageNet's, maps its k-th use to its k-th row); ``weight`` itself when the lists are equal
    or the checkpoint stored no names.

    Raises:
        ConfigError: a current class is not among the stored names.
    """
    current = list(current)
    if stored_names is None or list(stored_names) == current:
        return weight
    rows = {}
    for row, name in enumerate(stored_names):
        rows.setdefault(name, []).append(row)
    missing = [name for name in current if name not in rows]
    if missing:
        raise ConfigError(
            f'The classifier in "{model_path}" was trained on {len(stored_names)} classes that do not include '
            f"{len(missing)} class(es) of this dataset (e.g. {missing[:3]}); a fine-tuned classifier evaluates "
            "only on datasets whose classes are among its training classes (ImageNet -> ImageNet-V2/-Sketch/-A/-R)."
        )
    print(f"Classifier: keeping the {len(current)} of {len(stored_names)} trained rows that match this dataset's classes")
    used = {name: 0 for name in rows}
    selected = []
    for name in current:
        selected.append(rows[name][min(used[name], len(rows[name]) - 1)])
        used[name] += 1
    return weight[selected]


class FullFineTuningTrainer(ClipTrainer):
    """Base of the full fine-tuning trainers (see the module docstring).

    A subclass sets ``node_name`` (its config node under TRAINER, made with
    ``add_fine_tuning_keys``) and ``classifier_keys`` (state-dict keys whose rows are the
    classes), builds its model and calls ``register_fine_tuned(name, model, optim)``, which wraps
    the model in DistributedDataParallel under torchrun (``self.network``; ``self.model`` stays
    the plain module) and builds the schedule. Its ``forward_backward`` calls
    ``finish_step(summary)`` after the optimizer step. The registered model's name is the
    checkpoint folder; ``load_model`` reads ``<directory>/<model name>/``.
    """

    supports_distributed = True
    node_name = ""
    classifier_keys = ()

    def __init__(self, cfg):
        self.distributed = init_distributed(cfg.USE_CUDA)
        super().__init__(cfg)

    @property
    def node(self):
        """cfg.TRAINER.<node_name>."""
        return self.cfg.TRAINER[self.node_name]

    def check_fine_tuning_cfg(self, cfg):
        """ConfigError for the shared keys: LR_SCHEDULE, WARMUP_ITERS, the global batch."""
        node, name = cfg.TRAINER[self.node_name], f"TRAINER.{self.node_name}"
        check_choice(f"{name}.LR_SCHEDULE", node.LR_SCHEDULE, LR_SCHEDULES)
        check_range(f"{name}.WARMUP_ITERS", node.WARMUP_ITERS, minimum=0)
        if node.LR_SCHEDULE == "iteration":
            check_iteration_schedule(cfg.OPTIM, name)
        world = self.distributed.world_size if self.distributed else 1
        if cfg.DATALOADER.TRAIN_X.BATCH_SIZE % world:
            raise ConfigError(
                f"DATALOADER.TRAIN_X.BATCH_SIZE ({cfg.DATALOADER.TRAIN_X.BATCH_SIZE}) is the global batch and must "
                f"be divisible by the number of processes ({world})."
            )

    def head_templates(self):
        return head_templates(self.node, self.dm.dataset)

    def build_data_loader(self):
        super().build_data_loader()
        if self.distributed is not None:
            per_process = self.cfg.DATALOADER.TRAIN_X.BATCH_SIZE // self.distributed.world_size
            self.train_loader_x = self.build_distributed_train_loader(per_process)
            print(f"DistributedDataParallel: {self.distributed.world_size} processes x {per_process} images per step")

    def build_distributed_train_loader(self, batch_size):
        """This process's training loader under torchrun, ``batch_size`` (global batch / W) items
        per step (default: its shard of the engine's training loader)."""
        cfg = self.cfg
        return distributed_train_loader(self.dm.train_loader_x, self.distributed, batch_size, max(cfg.SEED, 0),
                                        shuffle=cfg.DATALOADER.TRAIN_X.SAMPLER != "SequentialSampler")

    def register_fine_tuned(self, name, model, optim):
        """Register ``model`` (on the device) under ``name`` with ``optim`` and the node's schedule."""
        if self.node.LR_SCHEDULE == "iteration":
            total = self.cfg.OPTIM.MAX_EPOCH * len(self.train_loader_x)
            sched = iteration_cosine_schedule(optim, self.node.WARMUP_ITERS, total)
        else:
            sched = build_lr_scheduler(optim, self.cfg.OPTIM)
        self.network = model
        if self.distributed is not None:
            device_ids = [self.distributed.local_rank] if self.device.type == "cuda" else None
            # Buffers are not broadcast: every process builds them alike from the config and none
            # changes in training (no batch norm); FLYP's caption token ids [T, C, L] would
            # otherwise be sent at every step.
            self.network = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
        self.register_model(name, self.network, optim, sched)

    def before_epoch(self):
        super().before_epoch()
        if self.distributed is not None:
            self.train_loader_x.sampler.set_epoch(self.epoch)

    def finish_step(self, summary):
        """Step the schedule (every iteration, or after an epoch's last batch) and return the
        step's summary averaged over the processes."""
        if self.node.LR_SCHEDULE == "iteration" or (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return mean_over_processes(summary, self.device)

    # ------------------------------------------------------------------- files (rank 0 only)
    def init_writer(self, log_dir):
        if is_main_process():
            super().init_writer(log_dir)

    def save_model(self, *args, **kwargs):
        if is_main_process():
            super().save_model(*args, **kwargs)

    def save_results(self):
        if is_main_process():
            return super().save_results()
        return None

    def get_trainer_state(self):
        return dict(super().get_trainer_state(), classnames=list(self.classnames))

    def load_model(self, directory, epoch=None):
        """The engine's load_model for the one registered model; the stored ``classifier_keys``
        are first reduced to the current classes (by name)."""
        if not directory:
            return super().load_model(directory, epoch)
        (name,) = self.get_model_names()
        model_path = str(RunFolder(directory).checkpoint_path(self.checkpoint_folder(directory, name), epoch))
        if not osp.exists(model_path):
            raise FileNotFoundError(self._model_not_found_message(model_path))
        checkpoint = load_checkpoint(model_path)
        state_dict = checkpoint["state_dict"]
        stored_names = (checkpoint.get("trainer_state") or {}).get("classnames")
        for key in self.classifier_keys:
            if key in state_dict:
                state_dict[key] = classifier_rows(state_dict[key], stored_names, self.classnames, model_path)
        print(f'Loading weights to {name} from "{model_path}" (epoch = {checkpoint["epoch"]})')
        self._load_state_dict_reporting(name, state_dict, set())
        self.weights_epoch = checkpoint["epoch"]

    def checkpoint_folder(self, directory, name):
        """The folder under ``directory`` whose checkpoints ``load_model`` reads (default: the
        registered model's ``name``; WiSEFT also reads other fine-tuning trainers' runs)."""
        return name
