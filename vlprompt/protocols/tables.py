"""Paper tables of each protocol from per-seed accuracies, with methods side by side.

Input: :class:`Measurements`, the accuracy of every (trainer, cfg, dataset, column, seed)
found on disk (``tools/parse_results.py`` reads them). Output: :class:`Table` objects,
rendered as terminal text, Markdown, LaTeX (booktabs) or CSV by :func:`render`.

Conventions (baselines spec §2.5):

* every measured cell is the mean ± population std over its seeds; a cell with fewer
  seeds than expected shows ``[k/n]`` and is listed in the notes (never silently averaged);
* base-to-novel HM = 2BN/(B+N) of the seed means; the Average row averages Base and Novel
  over the datasets having both, then takes the HM of those two means;
* an Average's ± is the std over seeds of the per-seed average, given only when every
  averaged cell has all expected seeds;
* a value computed from incomplete inputs (a partial cell, or a missing dataset) is
  marked ``†``;
* published numbers (:mod:`vlprompt.protocols.published`) add "pub." and "Δ" (ours −
  published) columns (base-to-novel) or rows (cross-dataset, DG).

A *method* is a trainer; when one trainer was run with several configs on the same
dataset, each config is a method of its own ("CoOp (vit_b16_ep50)"); configs on disjoint
datasets (CoOp's ImageNet recipe) stay one method and the notes say which ran where.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tabulate import tabulate

from .published import Published, find_published

__all__ = [
    "FORMATS", "Cell", "Column", "Row", "Table", "Measurements", "MethodGroup", "mean_std",
    "harmonic_mean", "method_groups", "base2new_table", "fewshot_table", "transfer_table",
    "format_cell", "render",
]

FORMATS = ("terminal", "markdown", "latex", "csv")
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


# ------------------------------------------------------------------------- builders


def _dataset_order(datasets, preferred: Sequence[str]) -> List[str]:
    datasets = set(datasets)
    first = [d for d in preferred if d in datasets]
    return first + sorted(datasets - set(first))


def _average(cells: Sequence[Cell], n_rows: int) -> Cell:
    """Mean of the cells' means; ± = std over seeds of the per-seed average when complete."""
    present = [c for c in cells if c.mean is not None]
    if not present:
        return Cell()
    mean = sum(c.mean for c in present) / len(present)
    flagged = len(present) < n_rows or any(c.incomplete for c in present)
    std = None
    if not flagged and all(c.values for c in present):
        seeds = [s for s, _ in present[0].values]
        if all([s for s, _ in c.values] == seeds for c in present):
            per_seed = [sum(dict(c.values)[s] for c in present) / len(present) for s in seeds]
            std = mean_std(per_seed)[1]
    return Cell(mean, std, flagged=flagged)


def _delta(ours: Cell, published: Optional[float]) -> Cell:
    if ours.mean is None or published is None:
        return Cell()
    return Cell(ours.mean - published, flagged=ours.incomplete, signed=True)


def _seed_notes(table: Table, seeds: Sequence[str]) -> None:
    """Legend and one note per cell with missing seeds."""
    table.notes.insert(0, f"mean ± std (population) over seeds {', '.join(seeds)}; "
                          f"[k/n]: only k of the n seeds; {DERIVED_MARK}: computed from incomplete "
                          "values; -: no completed run.")
    for row in table.rows:
        for column, cell in zip(table.columns, row.cells):
            if cell.missing_seeds:
                table.notes.append(f"missing seeds: {row.label} / {column.title}: "
                                   f"{', '.join(cell.missing_seeds)}")


def _published_notes(table: Table, used: Dict[str, Published]) -> None:
    for label, entry in used.items():
        table.notes.append(f"published {label}: {entry.source}")


def base2new_table(measurements: Measurements, seeds: Sequence[str], order: Sequence[str] = (),
                   select: Optional[Sequence[str]] = None,
                   published: Optional[Dict[str, Published]] = None) -> Table:
    """Rows: datasets (``order`` first) and Average; per method: Base, Novel, HM
    (+ pub. and Δ of each when ``published`` has the method).

    Base comes from ``train_base`` runs, or from ``test_base`` runs (released weights) for
    a method and dataset without ``train_base`` runs.
    """
    groups = method_groups(measurements, select)
    datasets = _dataset_order({d for g in groups for d, _ in g.cells}, order)
    columns: List[Column] = []
    per_method: List[List[List[Cell]]] = []  # method -> row -> cells
    notes, used = [], {}
    for group in groups:
        entry = find_published(published or {}, group.trainer, tuple(group.configs))
        metrics = [BASE, NOVEL, HM]
        names = [n for m in metrics for n in ((m, f"{m} pub.", f"Δ{m}") if entry else (m,))]
        columns += [Column(name, group.label) for name in names]
        rows, complete = [], []
        for dataset in datasets:
            base = Cell.measured(group.values(dataset, BASE) or group.values(dataset, BASE_RELEASED), seeds)
            novel = Cell.measured(group.values(dataset, NOVEL), seeds)
            hm = (Cell(harmonic_mean(base.mean, novel.mean), flagged=base.incomplete or novel.incomplete)
                  if base.mean is not None and novel.mean is not None else Cell())
            if hm.mean is not None:
                complete.append((base, novel))
            rows.append(_with_published([base, novel, hm], entry, dataset))
        average_base = _average([b for b, _ in complete], len(datasets))
        average_novel = _average([n for _, n in complete], len(datasets))
        average_hm = (Cell(harmonic_mean(average_base.mean, average_novel.mean),
                           flagged=average_base.flagged or average_novel.flagged)
                      if complete else Cell())
        rows.append(_with_published([average_base, average_novel, average_hm], entry, "average",
                                    comparable=_same_datasets(entry, datasets)))
        per_method.append(rows)
        if len(complete) < len(datasets):
            lacking = [d for d in datasets if not group.values(d, NOVEL)
                       or not (group.values(d, BASE) or group.values(d, BASE_RELEASED))]
            notes.append(f"{group.label}: Average over {len(complete)} of {len(datasets)} datasets "
                         f"(Base or Novel missing: {', '.join(lacking)})")
        if group.config_note():
            notes.append(group.config_note())
        if entry:
            used[group.label] = entry
            if not _same_datasets(entry, datasets):
                notes.append(f"{group.label}: the published Average is over other datasets than "
                             "this table's, so its Δ is marked †")
    labels = datasets + [AVERAGE]
    rows = [Row(label, [c for method in per_method for c in method[i]], summary=label == AVERAGE)
            for i, label in enumerate(labels)]
    table = Table("Base-to-novel generalization (Base / Novel / HM)", "Dataset", columns, rows, notes)
    _seed_notes(table, seeds)
    _published_notes(table, used)
    return table


def _same_datasets(entry: Optional[Published], datasets: Sequence[str]) -> bool:
    """Whether the published per-dataset rows are the table's datasets (True without rows)."""
    published_rows = set(entry.values) - {"average"} if entry else set()
    return not published_rows or published_rows == set(datasets)


def _with_published(cells: List[Cell], entry: Optional[Published], row: str,
                    comparable: bool = True) -> List[Cell]:
    """Each cell followed by its published value and Δ (flagged when not ``comparable``)."""
    if entry is None:
        return cells
    out = []
    for metric, cell in zip((BASE, NOVEL, HM), cells):
        value = entry.get(row, metric)
        delta = _delta(cell, value)
        if delta.mean is not None and not comparable:
            delta = Cell(delta.mean, flagged=True, signed=True)
        out += [cell, Cell(value), delta]
    return out


def fewshot_table(measurements: Measurements, seeds: Sequence[str], order: Sequence[str] = (),
                  select: Optional[Sequence[str]] = None) -> Table:
    """Rows: datasets and Average; per method one column per shot count (0 = zero-shot)."""
    groups = method_groups(measurements, select)
    datasets = _dataset_order({d for g in groups for d, _ in g.cells}, order)
    columns, per_method, notes = [], [], []
    for group in groups:
        shots = sorted({int(c) for _, c in group.cells})
        columns += [Column(f"{k}-shot", group.label) for k in shots]
        cells = [[Cell.measured(group.values(d, str(k)), seeds) for k in shots] for d in datasets]
        averages = [_average([row[i] for row in cells], len(datasets)) for i in range(len(shots))]
        per_method.append(cells + [averages])
        if group.config_note():
            notes.append(group.config_note())
    labels = datasets + [AVERAGE]
    rows = [Row(label, [c for method in per_method for c in method[i]], summary=label == AVERAGE)
            for i, label in enumerate(labels)]
    table = Table("Few-shot classification (accuracy per shot count)", "Dataset", columns, rows, notes)
    _seed_notes(table, seeds)
    return table


def transfer_table(measurements: Measurements, seeds: Sequence[str], source: str,
                   targets: Sequence[str], title: str, select: Optional[Sequence[str]] = None,
                   published: Optional[Dict[str, Published]] = None) -> Table:
    """Rows: methods (+ "published" and "Δ" rows); columns: source, every target (missing
    ones shown as -), Average of the targets (cross-dataset and domain generalization)."""
    groups = method_groups(measurements, select)
    found = {d for g in groups for d, _ in g.cells} - {source}
    targets = list(targets) + sorted(found - set(targets))
    columns = [Column(f"{source} (source)")] + [Column(t) for t in targets] + [Column(AVERAGE)]
    rows, notes, used = [], [], {}
    for group in groups:
        cells = [Cell.measured(group.values(d, ""), seeds) for d in [source, *targets]]
        ours = cells + [_average(cells[1:], len(targets))]
        rows.append(Row(group.label, ours))
        entry = find_published(published or {}, group.trainer, tuple(group.configs))
        if entry:
            values = [entry.get(d) for d in [source, *targets, "average"]]
            rows.append(Row(f"{group.label} (published)", [Cell(v) for v in values]))
            rows.append(Row(f"{group.label} Δ", [_delta(c, v) for c, v in zip(ours, values)]))
            used[group.label] = entry
        if group.config_note():
            notes.append(group.config_note())
    table = Table(title, "Method", columns, rows, notes)
    _seed_notes(table, seeds)
    _published_notes(table, used)
    return table


# ------------------------------------------------------------------------ rendering


def format_cell(cell: Cell, decimals: int = 2, latex: bool = False) -> str:
    """``81.17 ± 1.03``, ``80.50 ± 0.50 [2/3]``, ``65.73†``, ``+1.20``, or ``-``."""
    if cell.mean is None:
        return "-"
    text = f"{cell.mean:+.{decimals}f}" if cell.signed else f"{cell.mean:.{decimals}f}"
    if cell.std is not None:
        text += (r" $\pm$ " if latex else " ± ") + f"{cell.std:.{decimals}f}"
    if cell.missing_seeds:
        text += " " + PARTIAL_MARK.format(n=len(cell.values), expected=len(cell.expected))
    elif cell.flagged:
        text += r"$^\dagger$" if latex else DERIVED_MARK
    return text


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}", "Δ": r"$\Delta$", "±": r"$\pm$", "†": r"$^\dagger$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def _text_table(table: Table, decimals: int, tablefmt: str) -> str:
    headers = [table.corner] + [c.title for c in table.columns]
    body = [[row.label] + [format_cell(c, decimals) for c in row.cells] for row in table.rows]
    return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def _render_terminal(table: Table, decimals: int) -> str:
    lines = [table.title, _text_table(table, decimals, "github")]
    lines += [f"  {note}" for note in table.notes]
    return "\n".join(lines)


def _render_markdown(table: Table, decimals: int) -> str:
    lines = [f"### {table.title}", "", _text_table(table, decimals, "pipe"), ""]
    lines += [f"- {note}" for note in table.notes]
    return "\n".join(lines)


def _render_latex(table: Table, decimals: int) -> str:
    n = len(table.columns)
    lines = [f"% {table.title} (needs \\usepackage{{booktabs}})"]
    lines += [f"% {note}" for note in table.notes]
    lines += [r"\begin{tabular}{l" + "c" * n + "}", r"\toprule"]
    if any(c.group for c in table.columns):
        spans: List[Tuple[str, int]] = []
        for column in table.columns:
            if spans and spans[-1][0] == column.group:
                spans[-1] = (column.group, spans[-1][1] + 1)
            else:
                spans.append((column.group, 1))
        cells, rules, start = [""], [], 2
        for group, width in spans:
            cells.append(rf"\multicolumn{{{width}}}{{c}}{{{latex_escape(group)}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
            start += width
        lines += [" & ".join(cells) + r" \\", " ".join(rules)]
    header = [latex_escape(table.corner)] + [latex_escape(c.name) for c in table.columns]
    lines += [" & ".join(header) + r" \\", r"\midrule"]
    for row in table.rows:
        if row.summary:
            lines.append(r"\midrule")
        cells = [latex_escape(row.label)] + [format_cell(c, decimals, latex=True) for c in row.cells]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


CSV_HEADER = ("table", "row", "method", "column", "mean", "std", "n_seeds", "expected_seeds",
              "missing_seeds", "flagged")


def _render_csv(tables: Sequence[Table]) -> str:
    """Long format: one line per cell, numbers with 4 decimals."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for table in tables:
        for row in table.rows:
            for column, cell in zip(table.columns, row.cells):
                writer.writerow([
                    table.title, row.label, column.group, column.name,
                    "" if cell.mean is None else f"{cell.mean:.4f}",
                    "" if cell.std is None else f"{cell.std:.4f}",
                    len(cell.values) if cell.values else "", len(cell.expected) if cell.values else "",
                    " ".join(cell.missing_seeds), int(cell.flagged)])
    return out.getvalue().rstrip("\n")


def render(tables: Sequence[Table], fmt: str = "terminal", decimals: int = 2) -> str:
    """The tables in ``fmt`` (one of FORMATS), separated by blank lines (CSV: one file)."""
    if fmt == "csv":
        return _render_csv(tables)
    renderer = {"terminal": _render_terminal, "markdown": _render_markdown,
                "latex": _render_latex}.get(fmt)
    if renderer is None:
        raise ValueError(f"Unknown format {fmt!r}; choose from {', '.join(FORMATS)}.")
    return "\n\n".join(renderer(table, decimals) for table in tables)
