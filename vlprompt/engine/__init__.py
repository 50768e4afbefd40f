"""Trainers with Dassl's names (``dassl.engine``): registry, lifecycle, checkpoints, results file."""
from .build import TRAINER_REGISTRY, build_trainer
from .trainer import NonFiniteLossError, SimpleTrainer, TrainerBase, TrainerX
from .clip_trainer import ClipTrainer

__all__ = [
    "TRAINER_REGISTRY", "build_trainer", "TrainerBase", "SimpleTrainer", "TrainerX", "ClipTrainer",
    "NonFiniteLossError",
]
