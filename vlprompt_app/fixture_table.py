"""The table of the official-code comparisons, generated from their recorded fixtures.

Each ``tests/fixtures/official/<method>.json`` written by ``tools/official_equivalence.py`` holds
the official repository and commit it ran, the Dassl commit (``None`` when the official code
needs no Dassl), and ``relative_max_difference``: for each compared output,
``max|ours - official| / max|official|`` as measured when the fixture was recorded. The table is
derived from those files, so the documentation quotes the numbers the tests check instead of
copies of them. Files without a ``method`` key (e.g. the PromptKD teacher's CLIP shape) are
not comparisons and are skipped.
"""
import json
from pathlib import Path

from vlprompt.paths import repository_root

__all__ = ["FixtureTableError", "comparison_rows", "default_fixture_folder", "fidelity_table"]

REQUIRED_KEYS = ("method", "official_repository", "official_commit", "relative_max_difference")
HEADER = ("| Method | Official code | Dassl | Outputs compared: relative max difference |\n"
          "|---|---|---|---|")


class FixtureTableError(ValueError):
    """A fixture folder or file that the table cannot be made from."""


def default_fixture_folder() -> Path:
    """``tests/fixtures/official`` of the checkout."""
    return repository_root() / "tests" / "fixtures" / "official"


def _short(commit):
    return commit[:8] if commit else "none"


def comparison_rows(folder):
    """One dict per comparison fixture in ``folder``, sorted by method name.

    Each dict has ``method``, ``official`` ("owner/name @ 8-digit commit"), ``dassl`` (the
    8-digit Dassl commit, "own" when it is the official commit itself, "none" without Dassl)
    and ``differences`` (a list of (output name, relative max difference)). Raises
    FixtureTableError naming the folder or file when it has no comparison or lacks a key.
    """
    folder = Path(folder)
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise FixtureTableError(f"{folder}: expected official-comparison fixtures (*.json), found none")
    rows = []
    for path in paths:
        record = json.loads(path.read_text(encoding="utf-8"))
        if "method" not in record:
            continue
        missing = [key for key in REQUIRED_KEYS if key not in record]
        if missing:
            raise FixtureTableError(f"{path}: expected the keys {', '.join(REQUIRED_KEYS)}; missing {', '.join(missing)}")
        dassl = record.get("dassl_commit")
        rows.append({
            "method": record["method"],
            "official": f"{record['official_repository']} @ {_short(record['official_commit'])}",
            "dassl": "own" if dassl and dassl == record["official_commit"] else _short(dassl),
            "differences": list(record["relative_max_difference"].items()),
        })
    return sorted(rows, key=lambda row: row["method"].lower())


def fidelity_table(folder=None):
    """The Markdown table (header and one row per comparison) of ``folder``'s fixtures."""
    rows = comparison_rows(default_fixture_folder() if folder is None else folder)
    lines = [HEADER]
    for row in rows:
        differences = ", ".join(f"{name} {value:.2e}" for name, value in row["differences"])
        lines.append(f"| {row['method']} | {row['official']} | {row['dassl']} | {differences} |")
    return "\n".join(lines) + "\n"
