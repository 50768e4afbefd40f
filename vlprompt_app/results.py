"""Reading CoOp-family run folders and aggregating their accuracies into the tables of
``tools/parse_results.py`` (its command line is :mod:`vlprompt_app.commands.parse_results`).

A *run folder* is a folder that directly holds ``log.txt``, timestamped logs of later
runs (``log.txt-YYYY-MM-DD-HH-MM-SS``) or a ``results.json``; its files are read through
:class:`~vlprompt.engine.run_folder.RunFolder`. Run folders named ``seedN`` are the seeds of
the experiment named by their parent; any other run folder is one run of the experiment
named by its parent (e.g. the datasets of a zero-shot run).

Differences from the reference ``parse_test_res.py``:
both end signals "Finish training" and "Finished training" are accepted, the newest log
of a run folder is read (with a warning when there are several), the keyword is
regex-escaped, incomplete runs are listed with the reason instead of aborting or being
skipped silently, and a ``results.json`` written by our evaluator is used when present.

Base-to-novel aggregation follows the CoOp-family papers: accuracies are averaged over
seeds as printed (one decimal), the per-dataset HM is 2BN/(B+N) of the seed means, and
the Average row is the HM of the mean Base and the mean Novel over datasets.

The module imports neither torch nor numpy, so that the command starts fast and other
readers (``tools/plot_results.py``) reuse ``parse_log``, ``find_runs``, ``read_run``,
``aggregate``, ``harmonic_mean``, ``collect_experiments``, ``collect_base2new`` and
``collect_measurements``.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tabulate import tabulate

from vlprompt_app.protocols.benchmark import load_benchmark
from vlprompt_app.protocols.layout import BASE2NEW_DIR, TTT_DIR, parse_run_path
from vlprompt_app.protocols.tables import (
    BASE, BASE_RELEASED, NOVEL, Measurements, Table, base2new_table, fewshot_table,
    harmonic_mean, mean_std, transfer_table,
)
from vlprompt.engine.run_folder import (
    LOG_FILENAME, RESULTS_FILENAME, RunFolder, RunFolderError, is_replaced_folder, log_start_time,
)
from vlprompt.fileio import write_text
from vlprompt.paths import repository_root

TRAIN_END_SIGNALS: Tuple[str, ...] = ("Finish training", "Finished training")
TEST_END_SIGNALS: Tuple[str, ...] = ("=> result",)
PRINTED_DECIMALS = 1  # accuracy precision of Dassl >= 0.6.2 result lines
CI95_Z = 1.96

_SEED_DIR = re.compile(r"^seed(\d+)$")
_SHOTS_DIR = re.compile(r"^shots_\d+$")

BASE2NEW_TRAIN_DIR = "train_base"
BASE2NEW_TEST_BASE_DIR = "test_base"
BASE2NEW_NEW_DIR = "test_new"
# Its base2new datasets are the row order of the published base-to-novel tables.
ORDER_BENCHMARK = "paper"



class ResultsError(Exception):
    """Base class of the errors this tool reports to the user."""


class ResultsDirectoryError(ResultsError):
    """The directory to parse does not exist or is not a directory."""


class NoResultsError(ResultsError):
    """No run folder, or no completed run, was found."""


@dataclass(frozen=True)
class FoundRun:
    """A run folder found under the parsed directory (read through :class:`RunFolder`).

    Attributes:
        path: the folder.
        logs: its log files, oldest first (plain ``log.txt`` is the oldest, timestamped
            siblings are ordered by the timestamp in their name).
        results_json: its ``results.json`` or None.
    """

    path: Path
    logs: Tuple[Path, ...]
    results_json: Optional[Path]

    @property
    def newest_log(self) -> Optional[Path]:
        return self.logs[-1] if self.logs else None


@dataclass
class RunResult:
    """The value read from one run folder.

    Attributes:
        run: the run folder.
        value: the accuracy (percent) or None when the run is incomplete.
        source: the file the value was read from (a log or results.json), or None.
        reason: why ``value`` is None (one sentence), else None.
        notes: warnings for the user (several logs, stale results.json ignored).
    """

    run: FoundRun
    value: Optional[float]
    source: Optional[Path]
    reason: Optional[str] = None
    notes: List[str] = field(default_factory=list)


@dataclass
class Experiment:
    """Completed runs sharing a parent folder.

    Attributes:
        name: the parent folder relative to the parsed directory ("." for itself).
        runs: run label (seed number as text, or the run folder name) -> RunResult.
        mean: mean of the run values; spread: population std or 95% CI half-width.
    """

    name: str
    runs: Dict[str, RunResult]
    mean: float
    spread: float


@dataclass
class ExperimentReport:
    """Result of :func:`collect_experiments`."""

    directory: Path
    keyword: str
    end_signals: Tuple[str, ...]
    ci95: bool
    experiments: List[Experiment]
    incomplete: List[RunResult]

    @property
    def average_of_means(self) -> float:
        """Mean of the experiment means (the reference's --multi-exp "Average performance")."""
        return sum(e.mean for e in self.experiments) / len(self.experiments)


@dataclass
class Base2NewRow:
    """One dataset of a base-to-novel table; values map seed label -> accuracy."""

    dataset: str
    base_values: Dict[str, float]
    novel_values: Dict[str, float]

    @property
    def base(self) -> Optional[float]:
        return aggregate(list(self.base_values.values()))[0] if self.base_values else None

    @property
    def novel(self) -> Optional[float]:
        return aggregate(list(self.novel_values.values()))[0] if self.novel_values else None

    @property
    def hm(self) -> Optional[float]:
        if self.base is None or self.novel is None:
            return None
        return harmonic_mean(self.base, self.novel)


@dataclass
class Base2NewGroup:
    """The datasets of one TRAINER/CFG/shots combination, in table order."""

    trainer: str
    cfg: str
    shots: str
    rows: List[Base2NewRow]

    @property
    def complete_rows(self) -> List[Base2NewRow]:
        return [r for r in self.rows if r.hm is not None]

    def average(self) -> Optional[Tuple[float, float, float]]:
        """(mean Base, mean Novel, HM of the two means) over datasets having both, or None."""
        rows = self.complete_rows
        if not rows:
            return None
        base = sum(r.base for r in rows) / len(rows)
        novel = sum(r.novel for r in rows) / len(rows)
        return base, novel, harmonic_mean(base, novel)


@dataclass
class Base2NewReport:
    """Result of :func:`collect_base2new`; ``runs`` holds every run folder read (both sides)."""

    base_dir: Path
    new_dir: Path
    keyword: str
    base_end_signals: Tuple[str, ...]
    groups: List[Base2NewGroup]
    runs: List[RunResult]

    @property
    def incomplete(self) -> List[RunResult]:
        return [r for r in self.runs if r.value is None]


# --------------------------------------------------------------------------- reading


def require_directory(directory) -> Path:
    """``directory`` as a Path; raises ResultsDirectoryError when it is not an existing folder."""
    root = Path(directory)
    if not root.is_dir():
        raise ResultsDirectoryError(
            f"Results directory '{root}' does not exist or is not a directory: expected a folder "
            f"holding run folders (folders with {LOG_FILENAME} or {RESULTS_FILENAME}), "
            "e.g. output/base2new or output/base2new/train_base/dtd."
        )
    return root


def find_runs(directory) -> List[FoundRun]:
    """All run folders under ``directory`` (itself included), sorted by path.

    Hidden folders and the ``replaced-<date-time>`` folders of runs started afresh (train.py
    --restart) are skipped, and run folders are not searched further (their sub-folders hold
    checkpoints and tensorboard files).

    Raises:
        ResultsDirectoryError: ``directory`` does not exist or is not a folder.
    """
    root = require_directory(directory)
    runs = []
    for current, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and not is_replaced_folder(d))
        folder = Path(current)
        logs = RunFolder(folder).logs()
        results_json = folder / RESULTS_FILENAME if RESULTS_FILENAME in files else None
        if logs or results_json is not None:
            runs.append(FoundRun(folder, tuple(logs), results_json))
            subdirs[:] = []
    return sorted(runs, key=lambda r: r.path)


def _metric_pattern(keyword: str) -> "re.Pattern[str]":
    return re.compile(r"\* " + re.escape(keyword) + r": ([\.\deE+-]+)%")


def scan_log(path, keyword: str = "accuracy",
             end_signals: Sequence[str] = TRAIN_END_SIGNALS) -> Tuple[Optional[float], bool]:
    """Read one log as parse_test_res.py does.

    Returns:
        (value, signal_seen): the last ``* KEYWORD: X%`` value found after the first line
        equal (after stripping) to one of ``end_signals``, or None; and whether such a
        line was seen at all.
    """
    pattern = _metric_pattern(keyword)
    signals = set(end_signals)
    value, signal_seen = None, False
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not signal_seen:
                signal_seen = line.strip() in signals
                continue
            match = pattern.search(line)
            if match:
                try:
                    value = float(match.group(1))
                except ValueError:
                    continue
    return value, signal_seen


def parse_log(path, keyword: str = "accuracy",
              end_signals: Sequence[str] = TRAIN_END_SIGNALS) -> Optional[float]:
    """Value of ``* KEYWORD: X%`` in log ``path`` after an end signal (last one wins), or None."""
    return scan_log(path, keyword, end_signals)[0]


def _describe_signals(end_signals: Sequence[str]) -> str:
    return " or ".join(f"'{s}'" for s in end_signals)


def read_results_json(path: Path, keyword: str,
                      full_precision: bool = False) -> Tuple[Optional[float], Optional[str]]:
    """Value of ``metrics[keyword]`` in a results.json with ``"completed": true``.

    The value is rounded to the log's printed precision (one decimal) unless
    ``full_precision``. Returns (value, None) or (None, reason).
    """
    try:
        content = RunFolder(path.parent).load_results()
    except RunFolderError as error:
        return None, str(error)
    if content.get("completed") is not True:
        return None, f'{path.name} does not say "completed": true'
    metrics = content.get("metrics")
    number = metrics.get(keyword) if isinstance(metrics, dict) else None
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return None, f'{path.name} has no number metrics["{keyword}"]'
    value = float(number)
    return (value if full_precision else float(f"{value:.{PRINTED_DECIMALS}f}")), None


def _results_json_is_stale(results_json: Path, newest_log: Optional[Path]) -> bool:
    """True when results.json was written before the newest (timestamped) log was started."""
    started = log_start_time(newest_log) if newest_log is not None else None
    if started is None:
        return False
    return datetime.fromtimestamp(results_json.stat().st_mtime) < started


def read_run(run: FoundRun, keyword: str = "accuracy",
             end_signals: Sequence[str] = TRAIN_END_SIGNALS,
             full_precision: bool = False) -> RunResult:
    """Read the value of one run folder.

    A results.json with ``"completed": true`` and ``metrics[keyword]`` is used unless it is
    older than the newest timestamped log (then it belongs to an earlier run). Otherwise
    the newest log is scanned with :func:`scan_log`.
    """
    notes: List[str] = []
    json_reason = None
    if run.results_json is not None:
        if _results_json_is_stale(run.results_json, run.newest_log):
            notes.append(f"{run.results_json} is older than {run.newest_log.name}; "
                         "it belongs to an earlier run and is ignored")
        else:
            value, json_reason = read_results_json(run.results_json, keyword, full_precision)
            if value is not None:
                return RunResult(run, value, run.results_json, notes=notes)
    log = run.newest_log
    if log is None:
        return RunResult(run, None, None, reason=json_reason, notes=notes)
    if len(run.logs) > 1:
        notes.append(f"{run.path} holds {len(run.logs)} logs "
                     f"({', '.join(p.name for p in run.logs)}); using the newest, {log.name}")
    value, signal_seen = scan_log(log, keyword, end_signals)
    if value is not None:
        return RunResult(run, value, log, notes=notes)
    if not signal_seen:
        reason = (f"{log.name} has no end signal {_describe_signals(end_signals)} "
                  "(crashed, still running, or needs --test-log)")
    else:
        reason = f"{log.name} has no '* {keyword}: X%' line after the end signal"
    if json_reason is not None:
        reason = f"{json_reason}; {reason}"
    return RunResult(run, None, log, reason=reason, notes=notes)


# ----------------------------------------------------------------------- statistics


def aggregate(values: Sequence[float], ci95: bool = False) -> Tuple[float, float]:
    """(mean, spread) of ``values``; spread = population std (ddof 0) or 1.96·std/√n.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("aggregate() needs at least one value, got an empty sequence.")
    mean, std = mean_std(values)
    return mean, (CI95_Z * std / math.sqrt(len(values)) if ci95 else std)


# ---------------------------------------------------------------------- experiments


def run_label(folder: Path) -> str:
    """Seed number as text for ``seedN`` folders, else the folder name."""
    match = _SEED_DIR.match(folder.name)
    return match.group(1) if match else folder.name


def _label_sort_key(label: str):
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def _experiment_name(run_path: Path, root: Path) -> str:
    """The run folder's parent relative to ``root``; "." when the run folder is ``root`` itself."""
    return "." if run_path == root else run_path.parent.relative_to(root).as_posix()


def collect_experiments(directory, keyword: str = "accuracy",
                        end_signals: Sequence[str] = TRAIN_END_SIGNALS, ci95: bool = False,
                        full_precision: bool = False) -> ExperimentReport:
    """Read every run folder under ``directory`` and group completed runs into experiments.

    Raises:
        ResultsDirectoryError: ``directory`` is missing.
        NoResultsError: no run folder was found (incomplete runs are reported, not raised).
    """
    root = Path(directory)
    runs = find_runs(root)
    if not runs:
        raise NoResultsError(_nothing_found_message(root))
    grouped: Dict[str, Dict[str, RunResult]] = {}
    incomplete = []
    for run in runs:
        result = read_run(run, keyword, end_signals, full_precision)
        if result.value is None:
            incomplete.append(result)
            continue
        grouped.setdefault(_experiment_name(run.path, root), {})[run_label(run.path)] = result
    experiments = []
    for name in sorted(grouped):
        members = dict(sorted(grouped[name].items(), key=lambda kv: _label_sort_key(kv[0])))
        mean, spread = aggregate([r.value for r in members.values()], ci95)
        experiments.append(Experiment(name, members, mean, spread))
    return ExperimentReport(root, keyword, tuple(end_signals), ci95, experiments, incomplete)


def _nothing_found_message(*roots: Path) -> str:
    where = " or ".join(f"'{r}'" for r in roots)
    return (f"No run folder found under {where}: searched for folders directly holding "
            f"{LOG_FILENAME}, {LOG_FILENAME}-YYYY-MM-DD-HH-MM-SS or {RESULTS_FILENAME}.")


def _no_completed_message(where: str, n_runs: int, keyword: str, signals: str) -> str:
    return (f"No completed run under {where}: {n_runs} run folder(s) found, but none has a "
            f"'* {keyword}: X%' line after {signals} in its newest "
            f"{LOG_FILENAME}[-YYYY-MM-DD-HH-MM-SS], nor a {RESULTS_FILENAME} with "
            f'"completed": true and metrics["{keyword}"].')


# ------------------------------------------------------------------------- base2new


def is_base2new_dir(directory) -> bool:
    """True when ``directory`` holds ``test_new`` and ``train_base`` or ``test_base``."""
    root = Path(directory)
    return (root / BASE2NEW_NEW_DIR).is_dir() and (
        (root / BASE2NEW_TRAIN_DIR).is_dir() or (root / BASE2NEW_TEST_BASE_DIR).is_dir())


@functools.lru_cache(maxsize=None)
def base2new_dataset_order() -> Tuple[str, ...]:
    """Row order of the published base-to-novel tables: the base2new datasets of
    configs/benchmarks/paper.yaml (YAML stems); other datasets follow alphabetically."""
    return load_benchmark(ORDER_BENCHMARK, repository_root() / "configs").protocol("base2new").datasets


def _dataset_sort_key(dataset: str):
    order = base2new_dataset_order()
    if dataset in order:
        return (0, order.index(dataset), "")
    return (1, 0, dataset)


def _read_base2new_side(side_dir: Path, keyword: str, end_signals: Sequence[str],
                        full_precision: bool):
    """Read one side of a base-to-novel layout.

    Returns:
        (table, results): table maps (trainer, cfg, shots) -> dataset -> seed label -> value
        of the completed runs; results holds the RunResult of every run folder (a folder
        whose path is not DATASET/shots_K/TRAINER/CFG/seedS is not read and gets a reason).
    """
    table: Dict[Tuple[str, str, str], Dict[str, Dict[str, float]]] = {}
    results: List[RunResult] = []
    for run in find_runs(side_dir):
        parts = run.path.relative_to(side_dir).parts
        if len(parts) != 5 or not _SHOTS_DIR.match(parts[1]) or not _SEED_DIR.match(parts[4]):
            results.append(RunResult(run, None, None, reason=(
                f"path under {side_dir} is not DATASET/shots_K/TRAINER/CFG/seedS")))
            continue
        result = read_run(run, keyword, end_signals, full_precision)
        results.append(result)
        if result.value is not None:
            dataset, shots, trainer, cfg, seed_dir = parts
            by_dataset = table.setdefault((trainer, cfg, shots), {})
            by_dataset.setdefault(dataset, {})[run_label(Path(seed_dir))] = result.value
    return table, results


def collect_base2new(base_dir, new_dir, keyword: str = "accuracy",
                     base_end_signals: Sequence[str] = TRAIN_END_SIGNALS,
                     full_precision: bool = False) -> Base2NewReport:
    """Base / Novel / HM per TRAINER/CFG group from a base side and a test_new side.

    Base values are read with ``base_end_signals`` ("Finish training" for train_base,
    "=> result" for test_base), novel values always with "=> result".

    Raises:
        ResultsDirectoryError: one of the two directories is missing.
        NoResultsError: neither side has a run folder.
    """
    base_root, new_root = require_directory(base_dir), require_directory(new_dir)
    base, base_runs = _read_base2new_side(base_root, keyword, base_end_signals, full_precision)
    novel, novel_runs = _read_base2new_side(new_root, keyword, TEST_END_SIGNALS, full_precision)
    groups = []
    for key in sorted(set(base) | set(novel)):
        datasets = set(base.get(key, {})) | set(novel.get(key, {}))
        rows = [Base2NewRow(d, _sorted_values(base.get(key, {}).get(d, {})),
                            _sorted_values(novel.get(key, {}).get(d, {})))
                for d in sorted(datasets, key=_dataset_sort_key)]
        groups.append(Base2NewGroup(key[0], key[1], key[2], rows))
    if not base_runs and not novel_runs:
        raise NoResultsError(_nothing_found_message(base_root, new_root))
    return Base2NewReport(base_root, new_root, keyword, tuple(base_end_signals), groups,
                          base_runs + novel_runs)


def _sorted_values(values: Dict[str, float]) -> Dict[str, float]:
    return dict(sorted(values.items(), key=lambda kv: _label_sort_key(kv[0])))


# ------------------------------------------------------------------------ protocols

_EVALUATION_KINDS = ("test_base", "test_new", "evaluation", TTT_DIR)
_B2N_COLUMNS = {"train_base": BASE, "test_base": BASE_RELEASED, "test_new": NOVEL}
TRANSFER_TITLES = {"cross_dataset": "Cross-dataset transfer (train on the source, test on the targets)",
                   "dg": "Domain generalization (train on the source, test on its variants)",
                   "fft": "Full fine-tuning (RAda Table 1: train on the whole source set, test ID and OOD)",
                   "ttt": "Test-time adaptation (RAda Table 3: each test image adapted on its own)"}


@dataclass
class ProtocolResults:
    """The per-seed values of one protocol under a directory.

    Attributes:
        protocol: base2new, fewshot, cross_dataset, dg, fft or ttt.
        directory: the parsed folder.
        measurements: (trainer, cfg, dataset, column) -> seed -> value of completed runs.
        runs: RunResult of every run folder of the protocol (complete or not).
    """

    protocol: str
    directory: Path
    measurements: Measurements
    runs: List[RunResult]

    @property
    def incomplete(self) -> List[RunResult]:
        return [r for r in self.runs if r.value is None]


@dataclass(frozen=True)
class ProtocolScope:
    """Which runs of a protocol to read.

    Attributes:
        datasets: base2new/fewshot: only these datasets (None: all); cross_dataset/dg/fft/ttt:
            the target datasets (required).
        shots: only these shot counts (None: all; ttt: of the source model, 0 = none).
        source: the training dataset of cross_dataset/dg/fft (ttt: of the source model).
        order: preferred row order of base2new/fewshot datasets.
    """

    datasets: Optional[Tuple[str, ...]] = None
    shots: Optional[Tuple[int, ...]] = None
    source: Optional[str] = None
    order: Tuple[str, ...] = ()


def _protocol_cell(protocol: str, key, scope: ProtocolScope) -> Optional[Tuple[str, str]]:
    """(dataset, column) under which the run ``key`` counts for ``protocol``, or None."""
    if protocol == "ttt":
        shots_ok = scope.shots is None or key.shots in (0, *scope.shots)
        return (key.dataset, "") if key.kind == TTT_DIR and shots_ok and key.dataset in scope.datasets else None
    if scope.shots is not None and key.shots not in scope.shots:
        return None
    if protocol in TRANSFER_TITLES:
        if key.kind == "train" and key.dataset == scope.source:
            return key.dataset, ""
        if key.kind == "evaluation" and key.dataset in scope.datasets:
            return key.dataset, ""
        return None
    if scope.datasets is not None and key.dataset not in scope.datasets:
        return None
    if protocol == "base2new":
        column = _B2N_COLUMNS.get(key.kind)
        return None if column is None else (key.dataset, column)
    return (key.dataset, str(key.shots)) if key.kind == "train" else None


def collect_measurements(directory, protocol: str, scope: ProtocolScope = ProtocolScope(),
                         seeds: Optional[Sequence[str]] = None, keyword: str = "accuracy",
                         full_precision: bool = False) -> ProtocolResults:
    """Read the run folders of ``protocol`` under ``directory`` (the runner's output root,
    or its ``base2new`` folder); ``seeds``, when given, skips runs of other seeds.

    Raises:
        ResultsDirectoryError: ``directory`` is missing.
        ValueError: cross_dataset/dg without ``scope.source`` and ``scope.datasets``.
    """
    if protocol in TRANSFER_TITLES and (not scope.source or not scope.datasets):
        raise ValueError(f"collect_measurements({protocol!r}) needs scope.source and scope.datasets")
    root = require_directory(directory)
    prefix = (BASE2NEW_DIR,) if root.name == BASE2NEW_DIR or is_base2new_dir(root) else ()
    measurements, runs = Measurements(), []
    for run in find_runs(root):
        key = parse_run_path(prefix + run.path.relative_to(root).parts)
        if key is None or (seeds is not None and key.seed not in seeds):
            continue
        cell = _protocol_cell(protocol, key, scope)
        if cell is None:
            continue
        signals = TEST_END_SIGNALS if key.kind in _EVALUATION_KINDS else TRAIN_END_SIGNALS
        result = read_run(run, keyword, signals, full_precision)
        runs.append(result)
        if result.value is not None:
            measurements.add(key.trainer, key.cfg, cell[0], cell[1], key.seed, result.value)
    return ProtocolResults(protocol, root, measurements, runs)


def protocol_table(results: ProtocolResults, seeds: Sequence[str], scope: ProtocolScope = ProtocolScope(),
                   select: Optional[Sequence[str]] = None, published=None) -> Table:
    """The paper table of ``results`` (conventions in vlprompt_app/protocols/tables.py).

    Args:
        seeds: the expected seeds (cells with fewer are flagged).
        scope: row order (base2new/fewshot), source and targets (cross_dataset/dg).
        select: TRAINER or TRAINER:CFG entries picking and ordering the methods.
        published: method -> Published (base2new, cross_dataset, dg, fft, ttt).

    fft: RAda's Table 1 (ID = the source's test set, each OOD target, OOD average); ttt:
    RAda's Table 3 (each target, average).
    """
    meas = results.measurements
    title = TRANSFER_TITLES.get(results.protocol)
    if results.protocol == "base2new":
        return base2new_table(meas, seeds, scope.order, select, published)
    if results.protocol == "fewshot":
        return fewshot_table(meas, seeds, scope.order, select)
    if results.protocol == "fft":
        return transfer_table(meas, seeds, scope.source, scope.datasets, title, select, published,
                              source_title="ID ({})", average_title="OOD average")
    if results.protocol == "ttt":
        return transfer_table(meas, seeds, scope.source, scope.datasets, title, select, published,
                              source_title=None)
    return transfer_table(meas, seeds, scope.source, scope.datasets, title, select, published)


# ------------------------------------------------------------------------ rendering


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_experiments(report: ExperimentReport, multi_exp: bool = False) -> str:
    """The experiment table (tabulate, GitHub style); with ``multi_exp`` an Average row."""
    spread_name = "95% CI" if report.ci95 else "std"
    rows = [[e.name, len(e.runs), f"{e.mean:.2f} ± {e.spread:.2f}", ", ".join(e.runs)]
            for e in report.experiments]
    if multi_exp:
        rows.append([f"Average of {len(report.experiments)} experiment means", "",
                     f"{report.average_of_means:.2f}", ""])
    headers = ["experiment", "n", f"{report.keyword} (mean ± {spread_name})", "seeds"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def format_base2new(report: Base2NewReport) -> str:
    """One Base / Novel / HM table per TRAINER/CFG group, each ending in the Average row."""
    blocks = []
    for group in report.groups:
        rows = [[r.dataset, _fmt(r.base), _fmt(r.novel), _fmt(r.hm),
                 ", ".join(r.base_values) or "-", ", ".join(r.novel_values) or "-"]
                for r in group.rows]
        average = group.average()
        n_complete = len(group.complete_rows)
        rows.append([f"Average ({n_complete} datasets)"]
                    + ([_fmt(v) for v in average] if average else ["-", "-", "-"]) + ["", ""])
        title = f"{group.trainer} / {group.cfg} / {group.shots}"
        table = tabulate(rows, headers=["dataset", "Base", "Novel", "HM", "base seeds",
                                        "novel seeds"],
                         tablefmt="github", disable_numparse=True)
        lines = [title, table]
        missing = [r.dataset for r in group.rows if r.hm is None]
        if missing:
            lines.append(f"Not in Average (Base or Novel missing): {', '.join(missing)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_incomplete(incomplete: Iterable[RunResult]) -> str:
    """'Incomplete runs (excluded):' followed by one 'PATH: reason' line per run."""
    lines = [f"  {r.run.path}: {r.reason}" for r in incomplete]
    return "Incomplete runs (excluded):\n" + "\n".join(lines) if lines else ""


# ----------------------------------------------------------------------------- json


def _run_json(result: RunResult) -> dict:
    return {"path": str(result.run.path), "value": result.value,
            "source": None if result.source is None else str(result.source),
            "reason": result.reason}


def experiments_to_json(report: ExperimentReport) -> dict:
    """Machine-readable form of an :class:`ExperimentReport`."""
    return {
        "mode": "experiments", "directory": str(report.directory), "keyword": report.keyword,
        "end_signals": list(report.end_signals),
        "spread": "ci95" if report.ci95 else "std",
        "experiments": [{"name": e.name, "n": len(e.runs), "mean": e.mean, "spread": e.spread,
                         "runs": {label: _run_json(r) for label, r in e.runs.items()}}
                        for e in report.experiments],
        "average_of_means": report.average_of_means if report.experiments else None,
        "incomplete": [_run_json(r) for r in report.incomplete],
    }


def base2new_to_json(report: Base2NewReport) -> dict:
    """Machine-readable form of a :class:`Base2NewReport`."""
    groups = []
    for group in report.groups:
        average = group.average()
        groups.append({
            "trainer": group.trainer, "cfg": group.cfg, "shots": group.shots,
            "datasets": [{"dataset": r.dataset, "base": r.base, "novel": r.novel, "hm": r.hm,
                          "base_values": r.base_values, "novel_values": r.novel_values}
                         for r in group.rows],
            "average": None if average is None else {
                "base": average[0], "novel": average[1], "hm": average[2],
                "datasets": [r.dataset for r in group.complete_rows]},
        })
    return {"mode": "base2new", "base_dir": str(report.base_dir),
            "new_dir": str(report.new_dir), "keyword": report.keyword,
            "base_end_signals": list(report.base_end_signals), "groups": groups,
            "incomplete": [_run_json(r) for r in report.incomplete]}


def write_json(payload: dict, path: str) -> None:
    """Write ``payload`` as indented JSON, atomically (parent folders are created)."""
    write_text(json.dumps(payload, indent=4) + "\n", path)
