"""Trainers with Dassl's names (``dassl.engine``): registry, lifecycle, hooks, checkpoints, results file.

The names below are imported from their modules when first used (``from vlprompt.engine import
ClipTrainer``), so that importing one of the package's light modules (``vlprompt.engine.run_folder``
or ``run_lock``: a process that only reads run folders or holds their locks, such as a job that
starts train.py processes) does not import torch and the CLIP runner.
"""
import importlib

_EXPORTS = {
    "TRAINER_REGISTRY": "build", "build_trainer": "build", "HookBase": "hooks", "NonFiniteLossError": "trainer",
    "SimpleTrainer": "trainer", "TrainerBase": "trainer", "TrainerX": "trainer", "ClipTrainer": "clip_trainer",
}

__all__ = [
    "TRAINER_REGISTRY", "build_trainer", "TrainerBase", "SimpleTrainer", "TrainerX", "ClipTrainer",
    "HookBase", "NonFiniteLossError",
]


def __getattr__(name):
    """The exported ``name``, imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
