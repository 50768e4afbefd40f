"""The official-comparison table of docs/fidelity.md is the generator's output over the fixtures."""
import json
import re
from pathlib import Path

import pytest

from vlprompt_app.fixture_table import FixtureTableError, comparison_rows, fidelity_table

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"<!-- fidelity table: generated -->\n(.*?)<!-- end of the generated table -->", re.S)


def test_committed_table_is_the_generated_one():
    match = TABLE.search((ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8"))
    assert match, "docs/fidelity.md lacks the generated-table markers"
    assert match.group(1) == fidelity_table(), "docs/fidelity.md is stale: paste `python tools/fidelity_table.py`'s output"


def test_every_comparison_fixture_has_a_row():
    methods = {json.loads(path.read_text())["method"] for path in (ROOT / "tests/fixtures/official").glob("*.json")
               if "method" in json.loads(path.read_text())}
    rows = fidelity_table().splitlines()[2:]
    assert sorted(row.split(" | ")[0].lstrip("| ") for row in rows) == sorted(methods)


def test_row_fields(tmp_path):
    record = {"method": "X", "official_repository": "o/x", "official_commit": "0123456789abcdef",
              "dassl_commit": "0123456789abcdef", "relative_max_difference": {"logits": 1.234e-06, "loss": 0.0}}
    (tmp_path / "x.json").write_text(json.dumps(record))
    (tmp_path / "shape.json").write_text(json.dumps({"embed_dim": 8}))
    assert comparison_rows(tmp_path) == [{"method": "X", "official": "o/x @ 01234567", "dassl": "own",
                                          "differences": [("logits", 1.234e-06), ("loss", 0.0)]}]
    assert fidelity_table(tmp_path).splitlines()[2] == "| X | o/x @ 01234567 | own | logits 1.23e-06, loss 0.00e+00 |"


def test_bad_folders_are_named(tmp_path):
    with pytest.raises(FixtureTableError, match="found none"):
        fidelity_table(tmp_path)
    (tmp_path / "y.json").write_text(json.dumps({"method": "Y", "official_repository": "o/y"}))
    with pytest.raises(FixtureTableError, match="missing official_commit, relative_max_difference"):
        fidelity_table(tmp_path)
