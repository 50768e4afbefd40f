"""The run an ``--eval-only`` run loads (``--model-dir``), checked from its files before any data or
CLIP loads: the folder must exist, and a trainer that loads runs of particular trainers only
(:meth:`SimpleTrainer.source_trainers`, e.g. TPT with a CoOp prompt: CoOp runs) refuses a run of
another trainer, naming both. The trainer of a run is its ``config.yaml``'s TRAINER.NAME; a run of a
subclass of an accepted trainer (a copy of CoOp registered under another name) is accepted too.
"""
from vlprompt.config import ConfigError

from .run_folder import RunFolder

__all__ = ["check_model_dir"]


def check_model_dir(cfg, model_dir, registry) -> str:
    """Check the ``--model-dir`` of an evaluation run of ``cfg``; return the line that names its trainer.

    Args:
        cfg: the run's config (TRAINER.NAME names its trainer in ``registry``).
        model_dir: the folder given with ``--model-dir``.
        registry: the trainer registry.

    Raises:
        ConfigError: the folder does not exist, its ``config.yaml`` is unreadable, or it is a run of a
            trainer this one does not load (the message names both trainers).
    """
    folder = RunFolder(model_dir)
    if not folder.path.is_dir():
        raise ConfigError(f'--model-dir "{model_dir}" does not exist: give the output folder of the training run '
                          "whose weights this run evaluates.")
    node = (folder.read_config_data() or {}).get("TRAINER")
    trainer = node.get("NAME") if isinstance(node, dict) else None
    if not trainer:
        return f'Model folder: "{model_dir}" (its trainer is not recorded: no {folder.config_path.name})'
    accepted = registry.get(cfg.TRAINER.NAME).source_trainers(cfg)
    if accepted is not None and not _is_one_of(trainer, accepted, registry):
        raise ConfigError(
            f'--model-dir "{model_dir}" is a {trainer} run ({folder.config_path}), but {cfg.TRAINER.NAME} with this '
            f"config starts from a run of {' or '.join(accepted)}: its weights would not be what this run "
            f"expects. Give the folder of a {' or '.join(accepted)} run.")
    return f'Model folder: "{model_dir}", a {trainer} run ({folder.config_path})'


def _is_one_of(trainer, accepted, registry):
    if trainer in accepted:
        return True
    known = registry.registered_names()
    if trainer not in known:
        return False
    return any(issubclass(registry.get(trainer), registry.get(name)) for name in accepted if name in known)
