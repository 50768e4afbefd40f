"""Trainers with Dassl's names (``dassl.engine``): registry, lifecycle, hooks, checkpoints, results file."""
from .build import TRAINER_REGISTRY, build_trainer
from .hooks import HookBase
from .trainer import NonFiniteLossError, SimpleTrainer, TrainerBase, TrainerX
from .clip_trainer import ClipTrainer

__all__ = [
    "TRAINER_REGISTRY", "build_trainer", "TrainerBase", "SimpleTrainer", "TrainerX", "ClipTrainer",
    "HookBase", "NonFiniteLossError",
]
