"""Checks of the core config values that need no data, run before anything is loaded.

yacs already rejects unknown keys and wrong types (see :mod:`vlprompt.config.merge`); these
functions reject values that would fail later, or silently mean something else:
out-of-range sizes, unknown names, and combinations that do not make sense. Trainers check
their own node in ``check_cfg`` (with ``check_choice`` / ``check_range``). The checks live in
the engine, above the packages whose names they check (data: transforms, samplers, image checks;
optim: optimizers, schedules; engine: evaluation scopes), so that :mod:`vlprompt.config` imports
none of them.

Dassl keys that exist only so that Dassl's YAML files merge, and that nothing here reads
(``UNSUPPORTED_KEYS``), must keep their default: another value is rejected with the reason,
never silently ignored. tests/test_config_keys_used.py checks that every key of the merged
defaults is either read by the code or listed there.
"""
import os.path as osp

from vlprompt.config import ConfigError, check_choice, check_range, get_cfg_default
from vlprompt.data.checks import IMAGE_CHECKS
from vlprompt.data.samplers import SAMPLERS
from vlprompt.data.transforms.names import AVAI_CHOICES, INTERPOLATIONS, RESIZE_MODES, UNSUPPORTED_POLICIES
from vlprompt.optim.lr_scheduler import AVAI_SCHEDS
from vlprompt.optim.optimizer import AVAI_OPTIMS

from .compilation import check_compile_cfg
from .eval_scope import check_eval_scope

__all__ = ["validate_cfg", "check_training_cfg", "UNSUPPORTED_KEYS"]

SUBSAMPLE_CHOICES = ("all", "base", "new")
NONFINITE_LOSS_CHOICES = ("stop", "skip")
TEST_SPLITS = ("val", "test")
FINAL_MODELS = ("last_step", "best_val")
WARMUP_TYPES = ("constant", "linear")
IMAGE_FOLDER_LAYOUTS = ("auto", "folders", "list")

_SSL_DATASETS = (
    "Dassl reads it only in its semi-supervised CIFAR-10/100 and STL-10 datasets, which vlprompt does not "
    "have: every dataset here is fully labelled and has no train_u split"
)
_SIMPLENET_HEAD = (
    "it configures the MLP head of Dassl's SimpleNet (backbone + head + linear classifier); the CLIP "
    "trainers here classify with their own heads (text features, adapters, prompts) and build no SimpleNet"
)
# key -> why a value other than its default cannot be honoured here
UNSUPPORTED_KEYS = {
    "VERSION": "it is the version of Dassl's config format, of which 1 is the only one",
    "INPUT.RANDAUGMENT_N": "it sets Dassl's RandAugment policies, which are not implemented in vlprompt "
                           "(INPUT.TRANSFORMS rejects them)",
    "INPUT.RANDAUGMENT_M": "it sets Dassl's RandAugment policies, which are not implemented in vlprompt "
                           "(INPUT.TRANSFORMS rejects them)",
    "DATASET.NUM_LABELED": _SSL_DATASETS,
    "DATASET.VAL_PERCENT": (
        "Dassl reads it only in its semi-supervised CIFAR-10/100 and STL-10 datasets; the datasets here use "
        "CoOp's published split files (split_zhou_*.json) or, without one, CoOp's fixed per-class rules "
        "(20 % of trainval as val), and a few-shot run's val is min(NUM_SHOTS, 4) images per class, so that "
        "results stay comparable with the published ones"
    ),
    "DATASET.STL10_FOLD": "Dassl's STL-10 dataset is not among vlprompt's datasets",
    "DATASET.CIFAR_C_TYPE": "Dassl's CIFAR-10-C / CIFAR-100-C datasets (corruption type and level) are not "
                            "among vlprompt's datasets",
    "DATASET.CIFAR_C_LEVEL": "Dassl's CIFAR-10-C / CIFAR-100-C datasets (corruption type and level) are not "
                             "among vlprompt's datasets",
    "DATASET.ALL_AS_UNLABELED": _SSL_DATASETS,
    "MODEL.BACKBONE.PRETRAINED": (
        "CLIP methods always start from the pretrained CLIP weights named by MODEL.BACKBONE.WEIGHTS; "
        "a randomly initialised backbone is not supported"
    ),
    "MODEL.HEAD.NAME": _SIMPLENET_HEAD + " (train.py --head sets this key)",
    "MODEL.HEAD.HIDDEN_LAYERS": _SIMPLENET_HEAD,
    "MODEL.HEAD.ACTIVATION": _SIMPLENET_HEAD,
    "MODEL.HEAD.BN": _SIMPLENET_HEAD,
    "MODEL.HEAD.DROPOUT": _SIMPLENET_HEAD,
    "TRAIN.COUNT_ITER": (
        "in Dassl it picks which loader's length makes an epoch (train_x, train_u or smaller_one) for "
        "trainers that also train on unlabelled data (TrainerXU); every trainer here trains on labelled data "
        "only (TrainerX), so an epoch is always the batches of train_loader_x"
    ),
}


def _check_input(cfg):
    """INPUT keys; the preprocessing keys may be empty (the backbone's: vlprompt.clip.preprocess)."""
    size = cfg.INPUT.SIZE
    if len(size) not in (0, 2) or any(not isinstance(side, int) or side < 1 for side in size):
        raise ConfigError(f"INPUT.SIZE must be two positive integers (height, width), got {tuple(size)!r}. Leave it "
                          "empty, (), for the backbone's input size.")
    for key, value, choices in (("INTERPOLATION", cfg.INPUT.INTERPOLATION, INTERPOLATIONS),
                                ("RESIZE_MODE", cfg.INPUT.RESIZE_MODE, RESIZE_MODES)):
        if value:
            check_choice(f"INPUT.{key}", value, ["", *choices])
    for key, values in (("PIXEL_MEAN", cfg.INPUT.PIXEL_MEAN), ("PIXEL_STD", cfg.INPUT.PIXEL_STD)):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if len(values) not in (0, 3) or not numbers or (key == "PIXEL_STD" and any(v <= 0 for v in values)):
            raise ConfigError(f"INPUT.{key} must be three numbers (one per RGB channel"
                              + ("; positive" if key == "PIXEL_STD" else "")
                              + f"), or empty for the backbone's, got {list(values)!r}.")
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
    loader = cfg.DATALOADER
    for key, node in (("TRAIN_X", loader.TRAIN_X), ("TRAIN_U", loader.TRAIN_U), ("TEST", loader.TEST)):
        check_range(f"DATALOADER.{key}.BATCH_SIZE", node.BATCH_SIZE, minimum=1)
        check_choice(f"DATALOADER.{key}.SAMPLER", node.SAMPLER, SAMPLERS)
    check_range("DATALOADER.NUM_WORKERS", loader.NUM_WORKERS, minimum=0)
    check_range("DATALOADER.K_TRANSFORMS", loader.K_TRANSFORMS, minimum=1)
    check_range("DATASET.NUM_SHOTS", cfg.DATASET.NUM_SHOTS, minimum=-1,
                why="K >= 1 trains on K images per class; 0 or -1 (Dassl's default) on all training images.")
    root = osp.expanduser(cfg.DATASET.ROOT) if cfg.DATASET.ROOT else ""
    if root and osp.exists(root) and not osp.isdir(root):
        raise ConfigError(f'DATASET.ROOT (--root) "{cfg.DATASET.ROOT}" is a file; expected the folder that holds the '
                          "datasets (or your own images), which is made when it does not exist yet.")
    check_choice("DATASET.SUBSAMPLE_CLASSES", cfg.DATASET.SUBSAMPLE_CLASSES, SUBSAMPLE_CHOICES)
    check_choice("DATASET.CHECK_IMAGES", cfg.DATASET.CHECK_IMAGES, IMAGE_CHECKS)
    _check_image_folder(cfg.DATASET.IMAGE_FOLDER)


def _check_image_folder(node):
    """The DATASET.IMAGE_FOLDER node: a known layout, three positive split shares summing to 1,
    a sentence template with one "{}", a split file name."""
    check_choice("DATASET.IMAGE_FOLDER.LAYOUT", node.LAYOUT, IMAGE_FOLDER_LAYOUTS)
    if node.LAYOUT == "folders" and node.LIST_FILE:
        raise ConfigError(
            f'DATASET.IMAGE_FOLDER.LAYOUT is "folders" but LIST_FILE is "{node.LIST_FILE}"; a list file is '
            'read only by the "list" layout: set LAYOUT list (or auto), or clear LIST_FILE.'
        )
    ratio = tuple(node.SPLIT_RATIO)
    if len(ratio) != 3 or any(not isinstance(share, (int, float)) or share <= 0 for share in ratio) \
            or abs(sum(ratio) - 1) > 1e-6:
        raise ConfigError(
            "DATASET.IMAGE_FOLDER.SPLIT_RATIO must be three positive numbers (train, val, test shares of "
            f"each class) that sum to 1, e.g. (0.5, 0.2, 0.3); got {ratio!r}."
        )
    if node.TEMPLATE.count("{}") != 1:
        raise ConfigError(
            "DATASET.IMAGE_FOLDER.TEMPLATE must contain exactly one '{}' for the class name, "
            f"e.g. 'a photo of a {{}}.'; got '{node.TEMPLATE}'."
        )
    if not node.SPLIT_FILE:
        raise ConfigError(
            "DATASET.IMAGE_FOLDER.SPLIT_FILE is empty; it names the split JSON that is read when present "
            "and written otherwise (default split_zhou_ImageFolder.json under DATASET.ROOT)."
        )


def _check_optim(cfg):
    optim = cfg.OPTIM
    check_choice("OPTIM.NAME", optim.NAME, AVAI_OPTIMS)
    check_choice("OPTIM.LR_SCHEDULER", optim.LR_SCHEDULER, AVAI_SCHEDS)
    check_range("OPTIM.LR", optim.LR, minimum=0.0)
    if optim.WARMUP_EPOCH > 0:
        check_choice("OPTIM.WARMUP_TYPE", optim.WARMUP_TYPE, WARMUP_TYPES)


def _check_train_and_test(cfg):
    check_range("TRAIN.PRINT_FREQ", cfg.TRAIN.PRINT_FREQ, minimum=1)
    check_range("TRAIN.CHECKPOINT_ITERS", cfg.TRAIN.CHECKPOINT_ITERS, minimum=0, why="0 turns mid-epoch checkpoints off.")
    check_choice("TRAIN.NONFINITE_LOSS", cfg.TRAIN.NONFINITE_LOSS, NONFINITE_LOSS_CHOICES)
    check_compile_cfg(cfg)
    check_choice("TEST.SPLIT", cfg.TEST.SPLIT, TEST_SPLITS)
    check_choice("TEST.FINAL_MODEL", cfg.TEST.FINAL_MODEL, FINAL_MODELS)
    check_eval_scope(cfg.TEST.ROLE)
    if cfg.TEST.FINAL_MODEL == "best_val" and cfg.TEST.NO_TEST:
        raise ConfigError(
            "TEST.FINAL_MODEL best_val selects the model by evaluating on val after every epoch, but "
            "TEST.NO_TEST True turns evaluation off; use TEST.FINAL_MODEL last_step or TEST.NO_TEST False."
        )
    if cfg.RESUME and not osp.isdir(cfg.RESUME):
        raise ConfigError(f'RESUME (--resume) is "{cfg.RESUME}", which is not an existing folder.')


def _comparable(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _check_unsupported(cfg):
    defaults = get_cfg_default()
    for key, why in UNSUPPORTED_KEYS.items():
        value, default = cfg, defaults
        for name in key.split("."):
            value, default = value[name], default[name]
        if _comparable(value) != _comparable(default):
            raise ConfigError(
                f"{key} is {value!r}, but this key is not supported here and must keep its default "
                f"{default!r}: {why}. Remove it from the config file or the command line."
            )


def validate_cfg(cfg):
    """Raise ConfigError for the first core config value that is out of range, unknown,
    incompatible with another, or set for a key that is not supported here (module docstring).
    Needs no data and builds nothing."""
    _check_unsupported(cfg)
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
