"""Checks of the core config values that need no data, run before anything is loaded.

yacs already rejects unknown keys and wrong types (see :mod:`vlprompt.config.merge`); these
functions reject values that would fail later, or silently mean something else:
out-of-range sizes, unknown names, and combinations that do not make sense. Trainers check
their own node in ``check_cfg`` (with ``check_choice`` / ``check_range``).
"""
import os.path as osp

from .checks import check_choice, check_range
from .merge import ConfigError

__all__ = ["validate_cfg", "check_training_cfg"]

SUBSAMPLE_CHOICES = ("all", "base", "new")
NONFINITE_LOSS_CHOICES = ("stop", "skip")
TEST_SPLITS = ("val", "test")
FINAL_MODELS = ("last_step", "best_val")
WARMUP_TYPES = ("constant", "linear")


def _check_input(cfg):
    from vlprompt.data.transforms.transforms import AVAI_CHOICES, INTERPOLATION_MODES, UNSUPPORTED_POLICIES

    size = cfg.INPUT.SIZE
    if len(size) != 2 or any(not isinstance(side, int) or side < 1 for side in size):
        raise ConfigError(f"INPUT.SIZE must be two positive integers (height, width), got {tuple(size)!r}.")
    check_choice("INPUT.INTERPOLATION", cfg.INPUT.INTERPOLATION, list(INTERPOLATION_MODES))
    unknown = [name for name in cfg.INPUT.TRANSFORMS if name not in AVAI_CHOICES]
    if unknown:
        raise ConfigError(f"INPUT.TRANSFORMS has unknown transform(s) {unknown}; valid names are {AVAI_CHOICES}.")
    unsupported = [name for name in cfg.INPUT.TRANSFORMS if name in UNSUPPORTED_POLICIES]
    if unsupported:
        raise ConfigError(
            f"INPUT.TRANSFORMS asks for {unsupported}: Dassl's AutoAugment / RandAugment policies are not "
            "implemented in vlprompt; remove them from INPUT.TRANSFORMS."
        )


def _check_data(cfg):
    from vlprompt.data.checks import IMAGE_CHECKS
    from vlprompt.data.samplers import SAMPLERS

    loader = cfg.DATALOADER
    for key, node in (("TRAIN_X", loader.TRAIN_X), ("TRAIN_U", loader.TRAIN_U), ("TEST", loader.TEST)):
        check_range(f"DATALOADER.{key}.BATCH_SIZE", node.BATCH_SIZE, minimum=1)
        check_choice(f"DATALOADER.{key}.SAMPLER", node.SAMPLER, SAMPLERS)
    check_range("DATALOADER.NUM_WORKERS", loader.NUM_WORKERS, minimum=0)
    check_range("DATALOADER.K_TRANSFORMS", loader.K_TRANSFORMS, minimum=1)
    check_choice("DATASET.SUBSAMPLE_CLASSES", cfg.DATASET.SUBSAMPLE_CLASSES, SUBSAMPLE_CHOICES)
    check_choice("DATASET.CHECK_IMAGES", cfg.DATASET.CHECK_IMAGES, IMAGE_CHECKS)


def _check_optim(cfg):
    from vlprompt.optim.lr_scheduler import AVAI_SCHEDS
    from vlprompt.optim.optimizer import AVAI_OPTIMS

    optim = cfg.OPTIM
    check_choice("OPTIM.NAME", optim.NAME, AVAI_OPTIMS)
    check_choice("OPTIM.LR_SCHEDULER", optim.LR_SCHEDULER, AVAI_SCHEDS)
    check_range("OPTIM.LR", optim.LR, minimum=0.0)
    if optim.WARMUP_EPOCH > 0:
        check_choice("OPTIM.WARMUP_TYPE", optim.WARMUP_TYPE, WARMUP_TYPES)


def _check_train_and_test(cfg):
    from vlprompt.engine.roles import check_eval_role

    check_range("TRAIN.PRINT_FREQ", cfg.TRAIN.PRINT_FREQ, minimum=1)
    check_range("TRAIN.CHECKPOINT_ITERS", cfg.TRAIN.CHECKPOINT_ITERS, minimum=0, why="0 turns mid-epoch checkpoints off.")
    check_choice("TRAIN.NONFINITE_LOSS", cfg.TRAIN.NONFINITE_LOSS, NONFINITE_LOSS_CHOICES)
    check_choice("TEST.SPLIT", cfg.TEST.SPLIT, TEST_SPLITS)
    check_choice("TEST.FINAL_MODEL", cfg.TEST.FINAL_MODEL, FINAL_MODELS)
    check_eval_role(cfg.TEST.ROLE)
    if cfg.TEST.FINAL_MODEL == "best_val" and cfg.TEST.NO_TEST:
        raise ConfigError(
            "TEST.FINAL_MODEL best_val selects the model by evaluating on val after every epoch, but "
            "TEST.NO_TEST True turns evaluation off; use TEST.FINAL_MODEL last_step or TEST.NO_TEST False."
        )
    if cfg.RESUME and not osp.isdir(cfg.RESUME):
        raise ConfigError(f'RESUME (--resume) is "{cfg.RESUME}", which is not an existing folder.')


def validate_cfg(cfg):
    """Raise ConfigError for the first core config value that is out of range, unknown or
    incompatible with another (module docstring). Needs no data and builds nothing."""
    _check_input(cfg)
    _check_data(cfg)
    _check_optim(cfg)
    _check_train_and_test(cfg)


def check_training_cfg(cfg):
    """Raise ConfigError for a config that may be evaluated but not trained with.

    * DATASET.SUBSAMPLE_CLASSES new: the novel classes of the base-to-novel protocol are only
      ever evaluated (``--eval-only``); training on them would make "novel" accuracy meaningless.
    * OPTIM.MAX_EPOCH below 1.
    """
    if cfg.DATASET.SUBSAMPLE_CLASSES == "new":
        raise ConfigError(
            "DATASET.SUBSAMPLE_CLASSES new selects the novel classes, which the base-to-novel protocol only "
            "evaluates: train with DATASET.SUBSAMPLE_CLASSES base (or all), then evaluate the trained model "
            "on the novel classes with --eval-only --model-dir DIR DATASET.SUBSAMPLE_CLASSES new."
        )
    check_range("OPTIM.MAX_EPOCH", cfg.OPTIM.MAX_EPOCH, minimum=1, why="Training needs at least one epoch.")
