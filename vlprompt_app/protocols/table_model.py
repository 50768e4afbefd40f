"""The table model of the paper tables: per-seed measurements, cells, rows, methods.

* :class:`Measurements`: the accuracy of every (trainer, cfg, dataset, column, seed);
* :class:`Cell`: one entry (mean ± population std over seeds, the seeds present and
  expected, a † flag for values derived from incomplete inputs, a sign for differences);
  :class:`Column`, :class:`Row`, :class:`Table`: a table independent of its output format;
* :func:`method_groups`: measurements grouped into methods (a trainer, or a trainer with
  one of its configs when several configs ran on the same dataset);
* :func:`mean_std`, :func:`harmonic_mean`: the statistics of the cells.

The conventions are those of :mod:`vlprompt_app.protocols.tables` (the CoOp-family papers' conventions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "AVERAGE", "BASE", "NOVEL", "HM", "BASE_RELEASED", "PARTIAL_MARK", "DERIVED_MARK", "Cell", "Column",
    "Row", "Table", "Measurements", "MethodGroup", "mean_std", "harmonic_mean", "method_groups",
]

AVERAGE = "Average"
BASE, NOVEL, HM, BASE_RELEASED = "Base", "Novel", "HM", "Base (test_base)"
PARTIAL_MARK, DERIVED_MARK = "[{n}/{expected}]", "†"


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """(mean, population std) of a non-empty sequence."""
    if not values:
        raise ValueError("mean_std() needs at least one value, got an empty sequence.")
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def harmonic_mean(base: float, novel: float) -> float:
    """2·B·N/(B+N) (0 when both are 0)."""
    return 0.0 if base + novel == 0 else 2.0 * base * novel / (base + novel)


def _seed_key(seed: str):
    return (0, int(seed), "") if seed.isdigit() else (1, 0, seed)


@dataclass(frozen=True)
class Cell:
    """One table entry.

    Attributes:
        mean: the value (None: nothing to show).
        std: the ± part, or None.
        values: (seed, value) pairs of a measured cell, by seed.
        expected: the seeds a measured cell should have.
        flagged: derived from incomplete inputs (shown with †).
        signed: a difference, printed with its sign.
    """

    mean: Optional[float] = None
    std: Optional[float] = None
    values: Tuple[Tuple[str, float], ...] = ()
    expected: Tuple[str, ...] = ()
    flagged: bool = False
    signed: bool = False

    @classmethod
    def measured(cls, values: Mapping[str, float], expected: Sequence[str]) -> "Cell":
        """Mean ± std of the seed values (an empty mapping gives an empty cell)."""
        if not values:
            return cls(expected=tuple(expected))
        mean, std = mean_std(list(values.values()))
        ordered = tuple(sorted(values.items(), key=lambda kv: _seed_key(kv[0])))
        return cls(mean, std, ordered, tuple(expected))

    @property
    def missing_seeds(self) -> Tuple[str, ...]:
        present = {seed for seed, _ in self.values}
        return tuple(s for s in self.expected if s not in present) if self.values else ()

    @property
    def incomplete(self) -> bool:
        """No value, missing seeds, or derived from incomplete inputs."""
        return self.mean is None or bool(self.missing_seeds) or self.flagged


@dataclass(frozen=True)
class Column:
    """A column header; ``group`` is the method of column-per-method tables."""

    name: str
    group: str = ""

    @property
    def title(self) -> str:
        return f"{self.group} {self.name}".strip()


@dataclass
class Row:
    label: str
    cells: List[Cell]
    summary: bool = False  # an Average row (a rule above it in LaTeX)


@dataclass
class Table:
    """A rendered-format-independent table: ``corner`` heads the row-label column."""

    title: str
    corner: str
    columns: List[Column]
    rows: List[Row]
    notes: List[str] = field(default_factory=list)


@dataclass
class Measurements:
    """Per-seed values of one protocol: (trainer, cfg, dataset, column) -> seed -> value.

    ``column`` is "Base", "Base (test_base)" or "Novel" (base2new), the shot count as
    text (fewshot) or "" (cross_dataset, dg).
    """

    values: Dict[Tuple[str, str, str, str], Dict[str, float]] = field(default_factory=dict)

    def add(self, trainer: str, cfg: str, dataset: str, column: str, seed: str, value: float):
        self.values.setdefault((trainer, cfg, dataset, column), {})[seed] = value

    def seeds(self) -> List[str]:
        found = {seed for per_seed in self.values.values() for seed in per_seed}
        return sorted(found, key=_seed_key)


@dataclass
class MethodGroup:
    """The values of one method (a trainer, or a trainer with one of its configs).

    Attributes:
        label: column/row name.
        trainer: the trainer.
        cells: (dataset, column) -> seed -> value.
        configs: cfg -> datasets it was run on.
    """

    label: str
    trainer: str
    cells: Dict[Tuple[str, str], Dict[str, float]]
    configs: Dict[str, List[str]]

    def values(self, dataset: str, column: str) -> Dict[str, float]:
        return self.cells.get((dataset, column), {})

    def config_note(self) -> Optional[str]:
        if len(self.configs) < 2:
            return None
        parts = [f"{cfg} ({', '.join(sorted(datasets))})" for cfg, datasets in sorted(self.configs.items())]
        return f"{self.label} ran with configs {'; '.join(parts)}."


def method_groups(measurements: Measurements, select: Optional[Sequence[str]] = None) -> List[MethodGroup]:
    """Group the measurements into methods (see module docstring).

    Args:
        select: ``TRAINER`` or ``TRAINER:CFG`` entries that pick and order the methods
            (default: every trainer, alphabetically).
    """
    by_trainer: Dict[str, Dict[str, Dict[Tuple[str, str], Dict[str, float]]]] = {}
    for (trainer, cfg, dataset, column), values in measurements.values.items():
        if not values:
            continue
        if select is not None and trainer not in select and f"{trainer}:{cfg}" not in select:
            continue
        by_trainer.setdefault(trainer, {}).setdefault(cfg, {})[(dataset, column)] = values
    groups = []
    for trainer, per_cfg in by_trainer.items():
        cells = [set(c) for c in per_cfg.values()]
        disjoint = sum(len(c) for c in cells) == len(set().union(*cells))
        if disjoint:
            merged = {key: values for c in per_cfg.values() for key, values in c.items()}
            configs = {cfg: sorted({d for d, _ in c}) for cfg, c in per_cfg.items()}
            groups.append(MethodGroup(trainer, trainer, merged, configs))
        else:
            for cfg, c in sorted(per_cfg.items()):
                groups.append(MethodGroup(f"{trainer} ({cfg})", trainer, c, {cfg: sorted({d for d, _ in c})}))
    order = list(select or [])

    def rank(group: MethodGroup):
        keys = [f"{group.trainer}:{cfg}" for cfg in group.configs] + [group.trainer]
        positions = [order.index(k) for k in keys if k in order]
        return (min(positions) if positions else len(order), group.label)

    return sorted(groups, key=rank)

