"""Configuration (``dassl.config`` names plus the project's extension and merge helpers).

Typical set-up (train.py)::

    cfg = get_cfg_default()
    extend_cfg(cfg)                      # trainer nodes, e.g. TRAINER.COOP
    merge_from_file(cfg, dataset_yaml)
    merge_from_file(cfg, method_yaml)     # follows its _BASE_ chain, bases first
    merge_from_list(cfg, opts)
    cfg.freeze()
"""
from .defaults import _C as _CFG_DEFAULT
from .merge import ConfigError, config_chain, dump_cfg, merge_from_file, merge_from_list
from .checks import check_choice, check_range

__all__ = [
    "get_cfg_default",
    "clean_cfg",
    "register_cfg_extension",
    "extend_cfg",
    "ConfigError",
    "config_chain",
    "dump_cfg",
    "merge_from_file",
    "merge_from_list",
    "check_choice",
    "check_range",
]

# Functions fn(cfg) that add a trainer's config node, in registration order.
_CFG_EXTENSIONS = []


def get_cfg_default():
    """A fresh (mutable) copy of the default config."""
    return _CFG_DEFAULT.clone()


def clean_cfg(cfg, trainer):
    """Delete every ``TRAINER.*`` node except ``NAME`` and ``TRAINER.<trainer upper-cased>``."""
    keep = ("NAME", trainer.upper())
    for key in list(cfg.TRAINER.keys()):
        if key not in keep:
            cfg.TRAINER.pop(key)


def register_cfg_extension(fn):
    """Register ``fn(cfg)``, which adds config keys (e.g. ``cfg.TRAINER.COOP``); usable as a decorator.

    Trainer modules call it at import time. Registering a function with the same module
    and qualified name again (a module re-import) replaces the earlier entry in place.
    """
    identity = (fn.__module__, fn.__qualname__)
    for index, registered in enumerate(_CFG_EXTENSIONS):
        if (registered.__module__, registered.__qualname__) == identity:
            _CFG_EXTENSIONS[index] = fn
            return fn
    _CFG_EXTENSIONS.append(fn)
    return fn


def extend_cfg(cfg):
    """Apply every registered extension to ``cfg``, in registration order."""
    for extension in _CFG_EXTENSIONS:
        extension(cfg)
