"""tools/benchmark.py cocoop and feature-cache on tiny models: their records, and the figures
under their tables computed from those records."""
import json
import os
from types import SimpleNamespace

import pytest
from forked_runs import run_module

from vlprompt_app.benchmarking import cocoop, feature_cache

from vlprompt_app.commands import benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.e2e
def test_cocoop_chunks_give_the_same_logits(tmp_path, capsys, monkeypatch):
    """Each chunk size is measured in a process of its own (its peak memory is its own): here a forked one."""
    monkeypatch.setattr(cocoop, "subprocess", SimpleNamespace(run=run_module))
    path = tmp_path / "cocoop.json"
    argv = ["cocoop", "--classes", "8", "--images", "2", "--chunks", "0", "5", "--text-layers", "1", "--threads", "1",
            "--clock", "cpu", "--json", str(path)]
    assert benchmark.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["benchmark"] == "cocoop"
    whole, chunked = report["results"]
    assert (whole["case"], whole["chunk"], chunked["chunk"]) == ("chunk 16", 16, 5)  # 0: all 2 x 8 prompts
    assert whole["difference"] == 0.0 and chunked["difference"] < 1e-5
    assert whole["ms"] == whole["cpu_ms"] > 0 and chunked["mib_per_prompt"] == chunked["extra_peak_mib"] / 5
    positions = whole["positions"]
    assert chunked["positions"] == positions and 10 < positions < 77  # the longest name has 9 words, not 77 tokens
    assert cocoop.summary_lines(report) == [f"Text positions computed per pass: {positions} of 77"]
    assert f"Text positions computed per pass: {positions} of 77" in printed


def made_up_cache_report(uncached, fill, cached):
    """A feature-cache report whose records have these total seconds (two epochs each run)."""
    def record(case, total, count):
        return {"case": case, "s": total / count, "total_s": total, "count": count, "wall_s": 0.0, "cpu_s": 0.0}

    return {"results": [record("uncached epoch", uncached, 2), record("cache fill", fill, 1),
                        record("cached epoch", cached, 2)]}


def test_feature_cache_speed_ups_come_from_the_records():
    lines = feature_cache.summary_lines(made_up_cache_report(uncached=8.0, fill=1.0, cached=1.0))
    assert lines == ["speed-up per epoch: 8.0x; whole run incl. fill: 4.00x"]


def test_feature_cache_run_on_the_tiny_clip(tmp_path, capsys):
    clock = "cpu"
    path = tmp_path / "cache.json"
    argv = ["feature-cache", "--backbone", os.path.join(ROOT, "configs/clip/tiny-synthetic-clip.json"),
            "--image-size", "32", "--classes", "2", "--per-class", "2", "--epochs", "2", "--threads", "1",
            "--out", str(tmp_path / "run"), "--clock", clock, "--json", str(path)]
    assert benchmark.main(argv) == 0
    report = json.loads(path.read_text())
    records = {record["case"]: record for record in report["results"]}
    assert list(records) == ["uncached epoch", "cache fill", "cached epoch"]
    assert [records[name]["count"] for name in records] == [2, 1, 2]
    assert all(record["s"] == record[f"{clock}_s"] > 0 for record in records.values())
    assert report["settings"]["images"] == 4 and report["settings"]["clock"] == clock
    assert feature_cache.summary_lines(report)[0] in capsys.readouterr().out
