"""Trainer registry and ``build_trainer`` (Dassl's names)."""
from vlprompt.utils import Registry, check_availability

from .distributed import check_world_size

TRAINER_REGISTRY = Registry("TRAINER")


def build_trainer(cfg):
    """Instantiate the trainer registered under ``cfg.TRAINER.NAME``.

    Raises:
        ValueError: the name is not registered; the message lists every registered name and
            the most similar one (trainer modules register themselves when they are imported).
        ConfigError: torchrun started several processes of a trainer without DDP support.
    """
    check_availability(cfg.TRAINER.NAME, TRAINER_REGISTRY.registered_names())
    check_world_size(cfg.TRAINER.NAME, TRAINER_REGISTRY)
    if cfg.VERBOSE:
        print(f"Loading trainer: {cfg.TRAINER.NAME}")
    return TRAINER_REGISTRY.get(cfg.TRAINER.NAME)(cfg)
