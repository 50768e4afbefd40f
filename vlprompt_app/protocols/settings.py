"""The rerun rule over a whole grid: the runs whose folders hold a run with other settings.

The runner skips a completed run and lets train.py resume one that holds checkpoints; both are
right only when the folder's run is the one the grid asks for now. :func:`changed_runs` compares
each such run's merged config, as train.py would merge its arguments, with the config its folder
records (vlprompt/engine/rerun.py: the same keys are left out), before anything runs; the runs that
load a changed run's checkpoint (later in its chain) go with it. :func:`refusal` is the paragraph
the runner stops with; :func:`restart` starts the changed runs afresh (``--restart``), moving each
folder's files into its ``replaced-<date-time>/`` folder, as ``train.py --restart`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from vlprompt.config import ConfigError
from vlprompt.engine.rerun import Difference, default_data, format_differences, recorded_differences
from vlprompt.engine.run_folder import REPLACED_PREFIX, RunFolder

from .grid import Chain, Run

__all__ = ["ChangedRun", "changed_runs", "refusal", "restart"]


@dataclass(frozen=True)
class ChangedRun:
    """A run of the grid whose folder holds a run that is not the one asked for.

    Attributes:
        run: the run.
        differences: the recorded settings that differ (empty when only ``loads`` changed).
        loads: the output folder of a changed run whose checkpoint it loads, or None.
    """

    run: Run
    differences: Tuple[Difference, ...] = ()
    loads: Optional[str] = None


def _requested(run: Run, settings: Callable, file_cache: dict):
    """``settings(argv, file_cache)`` of ``run``'s train.py arguments, the message of a config that
    does not merge naming the run."""
    try:
        return settings(list(run.argv), file_cache)
    except ConfigError as error:
        raise ConfigError(f"{run.label}: {error}") from None


def _holds_a_run(folder: RunFolder) -> bool:
    """True when the next run into ``folder`` would take something over: a completed result (the
    run is skipped), checkpoints or test-time records (it resumes)."""
    return folder.completed or folder.holds_checkpoints() or folder.holds_test_time_records()


def _differences(run: Run, defaults, settings: Callable, file_cache: dict) -> Tuple[Difference, ...]:
    """The settings ``run``'s folder records that differ from the ones it is given; none when it
    records none (a folder of an earlier version: nothing to compare with)."""
    folder = RunFolder(run.output_dir)
    if not (folder.settings_path(False).is_file() or folder.settings_path(True).is_file()):
        return ()
    cfg, evaluation = _requested(run, settings, file_cache)
    return tuple(recorded_differences(folder, cfg, evaluation, defaults) or ())


def changed_runs(chains: Sequence[Chain], settings: Callable) -> List[ChangedRun]:
    """The runs of ``chains``, in order, whose folders hold a run with other settings, and the
    later runs of their chains that load them (directly or through another) and hold a result or
    state of their own.

    Args:
        settings: ``settings(argv, file_cache) -> (merged config, whether it evaluates a
            --model-dir)``, train.py's merge of a run's arguments (``file_cache``: the merged config
            files, shared by the grid's runs).

    Raises:
        ConfigError: a run's arguments do not merge (the message names the run).
    """
    changed: List[ChangedRun] = []
    defaults, file_cache = None, {}
    for chain in chains:
        replaced: Dict[str, str] = {}  # output folder of a changed run -> itself
        for run in chain.runs:
            loads = replaced.get(run.requires) if run.requires is not None else None
            if loads is not None:
                replaced[run.output_dir] = loads
            if not _holds_a_run(RunFolder(run.output_dir)):
                continue
            defaults = default_data() if defaults is None else defaults
            differences = _differences(run, defaults, settings, file_cache)
            if differences:
                changed.append(ChangedRun(run, differences))
                replaced[run.output_dir] = run.output_dir
            elif loads is not None:
                changed.append(ChangedRun(run, (), loads))
    return changed


def refusal(changed: Sequence[ChangedRun], output_root: str, limit: int = 8) -> str:
    """One paragraph: the changed runs grouped by their differences (at most ``limit`` groups) and
    the two ways on."""
    groups: Dict[str, List[str]] = {}
    for item in changed:
        if item.differences:
            groups.setdefault(format_differences(list(item.differences)), []).append(item.run.label)
    parts = [f"{', '.join(labels)} ({what})" for what, labels in list(groups.items())[:limit]]
    if len(groups) > limit:
        parts.append(f"and {len(groups) - limit} more")
    loading = [item.run.label for item in changed if not item.differences]
    also = (f"; and {len(loading)} run(s) that load their checkpoints: {', '.join(loading)}" if loading else "")
    count = sum(1 for item in changed if item.differences)
    return (f"{count} run(s) of this grid hold a run made with other settings than this command gives them, so they "
            f"would be skipped as completed or resumed: {'; '.join(parts)}{also}. Give this grid another --output "
            f"than {output_root}, or add --restart to start these runs afresh (each run's files are moved into "
            f"{REPLACED_PREFIX}<date-time>/ inside its folder). Keys that cannot change a result (paths, loader "
            "workers, evaluation batch size, logging) are not compared: NEUTRAL_KEYS in vlprompt/engine/rerun.py.")


def restart(changed: Sequence[ChangedRun]) -> List[str]:
    """Move the files of every changed run's folder aside (holding the folder's lock); returns a line
    per folder.

    Raises:
        RunFolderBusyError: another process holds one of the folders.
    """
    lines = []
    for item in changed:
        folder = RunFolder(item.run.output_dir)
        with folder.lock():
            aside = folder.move_aside()
        if aside is not None:
            lines.append(f"Started afresh (--restart): {item.run.label} (its earlier files are in {aside})")
    return lines
