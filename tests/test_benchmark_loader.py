"""tools/benchmark.py loader prints one row of train-loader images/s per worker count."""
import json
import os

import pytest


from vlprompt_app.commands import benchmark


def test_benchmark_on_a_small_synthetic_dataset(tmp_path, capsys):
    root = str(tmp_path / "bench")
    argv = ["loader", "--synthetic", root, "--synthetic-images", "2", "6", "--synthetic-size", "40", "30",
            "--workers", "0", "1", "--batch-size", "4", "--epochs", "2", "--json", str(tmp_path / "loader.json"),
            "INPUT.SIZE", "(32, 32)"]
    assert benchmark.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Train loader of DescribableTextures (12 images), batch 4, "
                               "random_resized_crop+random_flip+normalize at 32x32 (bicubic)")
    assert lines[1].split()[:7] == ["workers", "epoch", "1", "img/s", "epoch", "2", "img/s"]
    rows = [line.split() for line in lines[3:5]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(float(rate) > 0 for row in rows for rate in row[1:3])
    assert [row[3] for row in rows] == ["False", "True"]  # persistent workers only with workers
    assert len(os.listdir(os.path.join(root, "dtd", "images"))) == 2
    report = json.loads((tmp_path / "loader.json").read_text())
    assert report["benchmark"] == "loader" and report["settings"]["clock"] == "wall"
    printed = [row[1:3] for row in rows]
    assert [[f"{rate:.1f}" for rate in record["images_per_s"]] for record in report["results"]] == printed


def test_cpu_time_is_refused_with_a_reason(tmp_path):
    with pytest.raises(SystemExit, match="wall clock only"):
        benchmark.main(["loader", "--clock", "cpu", "--synthetic", str(tmp_path / "bench")])
