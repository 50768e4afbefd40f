"""The one record format of every benchmark family: a report and its printed table.

A report is a JSON object::

    {"benchmark": family, "settings": {...}, "commit": ..., "modified_files": [...],
     "torch": ..., "cpu_count": ..., "started": ..., "load_before": [1, 5, 15 min],
     "load_after": [...], "results": [record, ...]}

where every record is an object with at least ``"case"`` (its row name). A family module
provides ``HEADERS`` (or ``headers(settings)`` when the columns depend on the settings),
``table_rows(records)`` (one row per record), ``header_line(settings)`` and
``summary_lines(report)`` (derived figures printed under the table); ``tables(report)`` (optional)
gives more tables printed after those, as (title line, headers, rows).
"""
import json
import os
import subprocess
import time
from typing import List, Optional

import torch

from vlprompt.fileio import write_text
from vlprompt.paths import repository_root


def git_commit() -> str:
    """``git describe`` of the repository root ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                              text=True, cwd=repository_root(), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def modified_files() -> List[str]:
    """Uncommitted changes to the measured code ("git status --short" lines of vlprompt/ and trainers/)."""
    try:
        return subprocess.run(["git", "status", "--short", "--", "vlprompt", "trainers"], capture_output=True,
                              text=True, cwd=repository_root(), check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return []


def start_report(benchmark: str) -> dict:
    """A report without settings and results: the code and the machine's state before measuring."""
    return {"benchmark": benchmark, "commit": git_commit(), "modified_files": modified_files(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_before": os.getloadavg()}


def finish_report(report: dict, settings: dict, records: List[dict]) -> dict:
    """``report`` with the family's settings, its records and the load after measuring."""
    return {"benchmark": report["benchmark"], "settings": settings, **report, "load_after": os.getloadavg(),
            "results": records}


def machine_line(report: dict) -> str:
    """Commit and load average of a report, for its header line."""
    return (f"commit {report['commit']}; load average {report['load_before'][0]:.2f} before, "
            f"{report['load_after'][0]:.2f} after")


def read_report(path: str) -> dict:
    """A report written by ``write_report`` (a run of the per-trainer family before the
    envelope had a "benchmark" key is read as one)."""
    with open(path) as file:
        report = json.load(file)
    report.setdefault("benchmark", "trainers")
    return report


def write_report(report: dict, path: str):
    write_text(json.dumps(report, indent=1), path)


def format_table(rows: List[list], headers: List[str], table_format: str) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt=table_format, disable_numparse=True)


def format_report(report: dict, family, table_format: str = "simple", extra: Optional[List[str]] = None) -> str:
    """The header line, the table and the summary lines of ``report`` (``family``: its module)."""
    headers = family.headers(report["settings"]) if hasattr(family, "headers") else family.HEADERS
    lines = [family.header_line(report["settings"]) + "; " + machine_line(report),
             format_table(family.table_rows(report["results"]), headers, table_format)]
    lines += family.summary_lines(report)
    for title, headers, rows in (family.tables(report) if hasattr(family, "tables") else []):
        lines += [title, format_table(rows, headers, table_format)]
    lines += list(extra or [])
    return "\n".join(lines)
