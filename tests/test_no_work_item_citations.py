"""The repository speaks for itself: no tracked file (the CI harness in .ci/ aside) cites the
planning inputs beside it (the shared specification folder, a section of it) or a work item by its number.
An upstream repository's GitHub issue is a source and is cited with its '#' ("issue #5 of ...")."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"\bissues?[ -]\d+|\.\./shared\b|\bshared/(spec|papers)\b|\bspec(\.md)? ?§", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh", ".toml", ""}


def test_no_tracked_file_cites_a_work_item_or_the_planning_inputs():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in tracked.split():
        path = ROOT / name
        if path.suffix not in TEXT_SUFFIXES or not path.is_file() or name.startswith(("tests/fixtures/", ".ci/")):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if CITATION.search(line) and name != "tests/test_no_work_item_citations.py":
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert found == []
