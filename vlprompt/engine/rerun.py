"""Whether a run asks for the run its folder already holds (the rerun rule).

A run folder keeps what the next run of the same command reuses: checkpoints (a training run
resumes from the newest, or evaluates the finished model again) and a test-time method's
per-image records (an evaluation goes on after the last one). Reusing them is right only when
the command asks for the run the folder holds: resumed with another learning rate, a run would
train its remaining epochs on the old schedule and end as the old run, while its config.yaml
said otherwise.

So before a run writes anything, its merged config is compared with the one the folder records
(:meth:`RunFolder.settings_path`: ``config.yaml``, or ``eval_config.yaml`` for an evaluation of
a ``--model-dir``), leaving out the keys of :data:`NEUTRAL_KEYS`, which cannot change what the
run computes. A difference stops the run with :class:`SettingsChangedError`: one paragraph
listing the keys (old -> new) and the two ways on, another ``--output-dir`` or ``--restart``
(which moves the folder's files aside, :meth:`RunFolder.move_aside`, and starts afresh). A key
the record lacks (added to the project after the folder's run) counts as unchanged while the
command leaves it at its default.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from vlprompt.config import ConfigError, extend_cfg, get_cfg_default

from .run_folder import REPLACED_PREFIX, RunFolder

__all__ = [
    "NEUTRAL_KEYS", "Difference", "SettingsChangedError", "config_data", "default_data", "settings_differences",
    "format_differences", "recorded_differences", "check_rerun",
]

NEUTRAL_KEYS: Dict[str, str] = {
    "OUTPUT_DIR": "where the run writes: a moved or copied run folder resumes",
    "RESUME": "which folder a training run resumes from; that folder's own record is compared",
    "DATASET.ROOT": "where the datasets lie: a job resumed on another machine often reads a copy of the tree "
                    "at another path",
    "FEATURE_CACHE.DIR": "where encoded features are kept: an entry is found by what it holds, never by its folder",
    "DATALOADER.NUM_WORKERS": "processes that load images: an epoch's order and augmentations depend only on "
                              "torch's global generator, not on the workers (vlprompt/data/data_manager.py)",
    "DATALOADER.TEST.BATCH_SIZE": "images per evaluation batch: the trained weights never see it, a test-time "
                                  "method adapts to one image at a time, and batching changes a logit at most in "
                                  "its last bits",
    "TRAIN.PRINT_FREQ": "how often a training line is logged",
    "VERBOSE": "how much is logged",
    "TRAIN.CHECKPOINT_ITERS": "how often mid-epoch checkpoints are written: a run resumed from one ends exactly "
                              "as an uninterrupted run, and they are deleted when training ends",
}
"""Config keys left out of the rerun comparison, each with the reason it cannot change what a run
computes (a key names its whole sub-tree)."""


class SettingsChangedError(ConfigError):
    """The folder holds a run with other settings than the command asks for."""


@dataclass(frozen=True)
class Difference:
    """One compared key whose recorded value (``old``) is not the requested one (``new``);
    :data:`ABSENT` stands for a key one side does not have."""

    key: str
    old: Any
    new: Any

    def __str__(self):
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


ABSENT = object()


def _show(value) -> str:
    if value is ABSENT:
        return "(no such key)"
    return repr(value) if isinstance(value, str) else str(value)


def _flatten(data: Mapping, prefix: str = "") -> Dict[str, Any]:
    flat = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def _neutral(key: str) -> bool:
    return any(key == name or key.startswith(f"{name}.") for name in NEUTRAL_KEYS)


def config_data(cfg) -> dict:
    """``cfg`` (a CfgNode) as the plain data its ``config.yaml`` reads back as: nested dicts, tuples
    as lists (what ``yaml.safe_load(cfg.dump())`` gives, without the YAML round trip)."""
    if isinstance(cfg, Mapping):
        return {name: config_data(value) for name, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [config_data(value) for value in cfg]
    return cfg


def default_data() -> dict:
    """The default config, every registered trainer node included, as plain data."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    return config_data(cfg)


def settings_differences(recorded: Mapping, requested: Mapping,
                         defaults: Optional[Mapping] = None) -> List[Difference]:
    """The compared keys (all but :data:`NEUTRAL_KEYS`) whose values differ, sorted by key.

    Args:
        recorded, requested: configs as plain nested data (:func:`config_data`).
        defaults: the default config as plain data (None: the project's, trainer nodes included);
            a key missing from ``recorded`` is unchanged while ``requested`` holds its default.
    """
    old, new = _flatten(recorded), _flatten(requested)
    flat_defaults = _flatten(default_data() if defaults is None else defaults)
    differences = []
    for key in sorted(set(old) | set(new)):
        if _neutral(key):
            continue
        before, after = old.get(key, ABSENT), new.get(key, ABSENT)
        if before is ABSENT and after == flat_defaults.get(key, ABSENT):
            continue
        if before != after:
            differences.append(Difference(key, before, after))
    return differences


def format_differences(differences: List[Difference], limit: int = 12) -> str:
    """``KEY old -> new`` items joined by "; ", the first ``limit`` of them and a count of the rest."""
    shown = "; ".join(str(difference) for difference in differences[:limit])
    rest = len(differences) - limit
    return shown + (f"; and {rest} more" if rest > 0 else "")


def recorded_differences(folder: RunFolder, cfg, evaluation: bool,
                         defaults: Optional[Mapping] = None) -> Optional[List[Difference]]:
    """How ``cfg`` differs from the settings ``folder`` records (its :meth:`RunFolder.settings_path`
    for ``evaluation``, an evaluation of a --model-dir); None when it records none. ``defaults``: as
    for :func:`settings_differences` (pass :func:`default_data` once when comparing many runs).

    Raises:
        ConfigError: the record exists but is not a YAML mapping.
    """
    recorded = folder.read_settings(evaluation)
    return None if recorded is None else settings_differences(recorded, config_data(cfg), defaults)


def _reused_state(folder: RunFolder, training: bool) -> Optional[str]:
    """What a run would take over from ``folder``, or None."""
    if training and folder.holds_checkpoints():
        return "checkpoints"
    if folder.holds_test_time_records():
        return "the per-image records of a test-time evaluation"
    return None


def check_rerun(cfg, training: bool, evaluation: bool) -> List[str]:
    """Stop a run that would reuse the state of a run with other settings.

    The folder is ``cfg.RESUME`` (else ``cfg.OUTPUT_DIR``) for a training run, ``cfg.OUTPUT_DIR``
    otherwise; it is compared only when it holds state the run reuses (:func:`_reused_state`).

    Args:
        cfg: the run's merged config.
        training: the run trains (resumes from checkpoints).
        evaluation: the run evaluates a --model-dir (its record is ``eval_config.yaml``).

    Returns:
        Lines for the log: a note when the folder holds state but no record to compare with.

    Raises:
        SettingsChangedError: the recorded settings differ; the message lists the keys.
    """
    folder = RunFolder(cfg.RESUME if training and cfg.RESUME else cfg.OUTPUT_DIR)
    state = _reused_state(folder, training)
    if state is None:
        return []
    record = folder.settings_path(evaluation)
    differences = recorded_differences(folder, cfg, evaluation)
    if differences is None:
        return [f'Note: "{folder.path}" holds {state} but no {record.name} (a folder of an earlier version or of '
                "Dassl): the settings they were made with cannot be compared with this command's; reusing them."]
    if differences:
        if training and cfg.RESUME:
            ways = "Resume from another folder (RESUME), or give the settings it records"
        else:
            ways = (f'Give this run another --output-dir, or add --restart to start "{cfg.OUTPUT_DIR}" afresh (its '
                    f"files are moved into {REPLACED_PREFIX}<date-time>/ inside it)")
        raise SettingsChangedError(
            f'"{folder.path}" holds {state} of a run with other settings than this command asks for '
            f"({record}): {format_differences(differences)}. Going on would reuse them, so the result would not "
            f"be that of the settings given. {ways}. Keys that cannot change the result (paths, loader workers, "
            "evaluation batch size, logging) are not compared: NEUTRAL_KEYS in vlprompt/engine/rerun.py.")
    return []
