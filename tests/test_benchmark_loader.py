"""tools/benchmark_loader.py prints one row of train-loader images/s per worker count."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import benchmark_loader  # noqa: E402


def test_benchmark_on_a_small_synthetic_dataset(tmp_path, capsys):
    root = str(tmp_path / "bench")
    argv = ["--synthetic", root, "--synthetic-images", "2", "6", "--synthetic-size", "40", "30",
            "--workers", "0", "1", "--batch-size", "4", "--epochs", "2", "INPUT.SIZE", "(32, 32)"]
    benchmark_loader.main(argv)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Train loader of DescribableTextures (12 images), batch 4, "
                               "random_resized_crop+random_flip+normalize at 32x32 (bicubic)")
    assert lines[1].split()[:7] == ["workers", "epoch", "1", "img/s", "epoch", "2", "img/s"]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(float(rate) > 0 for row in rows for rate in row[1:3])
    assert [row[3] for row in rows] == ["False", "True"]  # persistent workers only with workers
    assert len(os.listdir(os.path.join(root, "dtd", "images"))) == 2
