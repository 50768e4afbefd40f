"""Paper tables of each protocol from per-seed accuracies, with methods side by side.

Input: :class:`Measurements`, the accuracy of every (trainer, cfg, dataset, column, seed)
found on disk (``tools/parse_results.py`` reads them). Output: :class:`Table` objects,
rendered as terminal text, Markdown, LaTeX (booktabs) or CSV by :func:`render`.

This module builds the three kinds of table (:func:`base2new_table`, :func:`fewshot_table`,
:func:`transfer_table`); the cells, rows and method grouping are in
:mod:`vlprompt_app.protocols.table_model`, the output formats in
:mod:`vlprompt_app.protocols.table_render`, the published numbers in
:mod:`vlprompt_app.protocols.published`. The names tools import from here are re-exported.

Conventions (those of the CoOp-family papers):

* every measured cell is the mean ± population std over its seeds; a cell with fewer
  seeds than expected shows ``[k/n]`` and is listed in the notes (never silently averaged);
* base-to-novel HM = 2BN/(B+N) of the seed means; the Average row averages Base and Novel
  over the datasets having both, then takes the HM of those two means;
* an Average's ± is the std over seeds of the per-seed average, given only when every
  averaged cell has all expected seeds;
* a value computed from incomplete inputs (a partial cell, or a missing dataset) is
  marked ``†``;
* published numbers (:mod:`vlprompt_app.protocols.published`) add "pub." and "Δ" (ours −
  published) columns (base-to-novel) or rows (cross-dataset, DG). A published method without
  runs here (no trainer of that name measured, and picked by ``select`` when given) gets
  its published columns or row alone, after the measured methods (in ``select``'s order, else
  the file's: the papers' tables), when one of its rows is a row of the table; the table's
  datasets then also include the published ones among the benchmark's (``order``), so that
  ``--published`` without any run prints the papers' tables.

A *method* is a trainer; when one trainer was run with several configs on the same
dataset, each config is a method of its own ("CoOp (vit_b16_ep50)"); configs on disjoint
datasets (CoOp's ImageNet recipe) stay one method and the notes say which ran where.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .published import Published, find_published
from .table_model import (
    AVERAGE, BASE, BASE_RELEASED, DERIVED_MARK, HM, NOVEL, Cell, Column, Measurements, MethodGroup, Row, Table,
    harmonic_mean, mean_std, method_groups,
)
from .table_render import FORMATS, format_cell, render

__all__ = [
    "FORMATS", "AVERAGE", "BASE", "BASE_RELEASED", "HM", "NOVEL", "Cell", "Column", "Row", "Table", "Measurements",
    "MethodGroup", "mean_std", "harmonic_mean", "method_groups", "base2new_table", "fewshot_table", "transfer_table",
    "format_cell", "render",
]


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
    """Legend and one note per cell with missing seeds (no legend for a table of published numbers only)."""
    if not seeds:
        return
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
    published_only = _published_only(published, groups, select)
    measured = {d for g in groups for d, _ in g.cells}
    listed = {row for entry in published_only.values() for row in entry.values} & set(order)
    datasets = _dataset_order(measured | listed, order)
    published_only = _published_rows(published_only, datasets)
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
    for key, entry in published_only.items():
        columns += [Column(f"{metric} pub.", key) for metric in (BASE, NOVEL, HM)]
        per_method.append([[Cell(entry.get(row, metric)) for metric in (BASE, NOVEL, HM)]
                           for row in datasets + ["average"]])
        used[key] = entry
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


def _published_only(published: Optional[Dict[str, Published]], groups: Sequence[MethodGroup],
                    select: Optional[Sequence[str]]) -> Dict[str, Published]:
    """Published entries (key ``TRAINER`` or ``TRAINER:CFG``) of trainers that have no group here
    and that ``select`` picks (every one when None), in ``select``'s order, else the file's."""
    measured = {group.trainer for group in groups}
    keys = [key for key in published or {} if key.split(":")[0] not in measured
            and (select is None or key in select or key.split(":")[0] in select)]
    if select is not None:
        order = list(select)
        keys.sort(key=lambda key: order.index(key) if key in order else order.index(key.split(":")[0]))
    return {key: published[key] for key in keys}


def _published_rows(entries: Dict[str, Published], rows: Sequence[str]) -> Dict[str, Published]:
    """The entries with a value in at least one of ``rows``."""
    return {key: entry for key, entry in entries.items() if any(row in entry.values for row in rows)}


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
                   published: Optional[Dict[str, Published]] = None, source_title: Optional[str] = "{} (source)",
                   average_title: str = AVERAGE) -> Table:
    """Rows: methods (+ "published" and "Δ" rows); columns: source, every target (missing
    ones shown as -), Average of the targets (cross-dataset, domain generalization, and RAda's
    Table 1 (fft) and Table 3 (ttt)).

    Args:
        source_title: header of the source column (``{}`` = the source's name), or None for
            a table without it (ttt: the source only trains the model the runs start from).
        average_title: header of the targets' average column.
    """
    groups = method_groups(measurements, select)
    found = {d for g in groups for d, _ in g.cells} - {source}
    targets = list(targets) + sorted(found - set(targets))
    shown = ([source] if source_title is not None else []) + targets
    columns = ([Column(source_title.format(source))] if source_title is not None else []) \
        + [Column(t) for t in targets] + [Column(average_title)]
    rows, notes, used = [], [], {}
    for group in groups:
        cells = [Cell.measured(group.values(d, ""), seeds) for d in shown]
        ours = cells + [_average(cells[len(shown) - len(targets):], len(targets))]
        rows.append(Row(group.label, ours))
        entry = find_published(published or {}, group.trainer, tuple(group.configs))
        if entry:
            values = [entry.get(d) for d in [*shown, "average"]]
            rows.append(Row(f"{group.label} (published)", [Cell(v) for v in values]))
            rows.append(Row(f"{group.label} Δ", [_delta(c, v) for c, v in zip(ours, values)]))
            used[group.label] = entry
        if group.config_note():
            notes.append(group.config_note())
    for key, entry in _published_rows(_published_only(published, groups, select), shown).items():
        rows.append(Row(f"{key} (published)", [Cell(entry.get(d)) for d in [*shown, "average"]]))
        used[key] = entry
    table = Table(title, "Method", columns, rows, notes)
    _seed_notes(table, seeds)
    _published_notes(table, used)
    return table
