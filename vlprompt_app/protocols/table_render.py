"""Output formats of the paper tables: terminal text, Markdown, LaTeX (booktabs) and CSV.

:func:`render` turns :class:`~vlprompt_app.protocols.table_model.Table` objects into one string
in a format of ``FORMATS``; :func:`format_cell` writes one cell (``81.17 ± 1.03``,
``80.50 ± 0.50 [2/3]``, ``65.73†``, ``+1.20`` or ``-``). CSV is long format: one line per
cell (``CSV_HEADER``), numbers with 4 decimals.
"""
from __future__ import annotations

import csv
import io
from typing import List, Sequence, Tuple

from tabulate import tabulate

from .table_model import DERIVED_MARK, PARTIAL_MARK, Cell, Table

__all__ = ["FORMATS", "CSV_HEADER", "format_cell", "latex_escape", "render"]

FORMATS = ("terminal", "markdown", "latex", "csv")




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
