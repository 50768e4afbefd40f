"""README.md's "Your own images" runs as written: the example tree, CoOp and DeAR trained 16-shot on
it, predictions from the runs and from their exports, and the Python example."""
import ast
import contextlib
import csv
import io
import os
import re
from pathlib import Path

import pytest
from forked_runs import run_commands
from test_readme import code_blocks, section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["red circle", "orange diamond", "green triangle", "blue crescent", "pink hexagon",
           "red square", "orange ring", "green star", "blue heart", "pink cross"]


def csv_rows(text):
    """Rows of the CSV that starts at the header line "path,label_1,..." of ``text``."""
    start = text.index("path,label_1,")
    return list(csv.reader(io.StringIO(text[start:])))


@pytest.mark.e2e
def test_own_images_commands_and_python_example_run(tmp_path, monkeypatch):
    """The section's commands in a fresh-clone state: its output/ paths are moved under tmp_path."""
    text = section("Your own images")
    (script,) = code_blocks(text, "bash")
    (example,) = code_blocks(text, "python")
    out = f"{tmp_path}/output/"
    result = run_commands(script.replace("output/", out))  # as tests/test_readme.py's main job
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    assert f"Wrote 10 classes x 40 images to {out}my_images: {', '.join(CLASSES)}" in result.stdout
    accuracies = [float(value) for value in re.findall(r"^\* accuracy: ([\d.]+)%", result.stdout, re.M)]
    assert len(accuracies) == 2 and len(re.findall(r"^Elapsed: ", result.stdout, re.M)) == 2
    quoted = re.search(r"CoOp ends with `\* accuracy: ([\d.]+)%` and DeAR with `\* accuracy: ([\d.]+)%`", text)
    assert quoted, "the section no longer quotes the two accuracies"
    # 120 test images: one image is 0.83 points; another CPU's floating-point order may move two.
    assert accuracies == pytest.approx([float(value) for value in quoted.groups()], abs=1.7)

    # The two images' rows on stdout (the first predict command), the 3 best classes each.
    rows = csv_rows(result.stdout)
    assert rows[0] == ["path", "label_1", "probability_1", "label_2", "probability_2", "label_3", "probability_3",
                       "error"]
    assert [row[0] for row in rows[1:3]] == [f"{out}my_images/red_circle/0000.png", f"{out}my_images/blue_heart/0003.png"]
    assert all(row[1] in CLASSES and row[7] == "" for row in rows[1:3])
    folder = csv_rows(Path(f"{out}green_star.csv").read_text())
    assert len(folder) == 1 + 40 and len(folder[0]) == 6
    assert sum(row[1] == "green star" for row in folder[1:]) >= 30
    assert "CoOp classifier (10 classes, cosine head)" in result.stderr
    assert "DeAR classifier (10 classes, trainer head)" in result.stderr
    exported = csv_rows(Path(f"{out}pink_cross.csv").read_text())
    assert len(exported) == 1 + 40 and sum(row[1] == "pink cross" for row in exported[1:]) >= 30

    monkeypatch.chdir(ROOT)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example.replace("output/", out), "README-own-images", "exec"), {})
    lines = printed.getvalue().splitlines()
    predicted = [line for line in lines if line.startswith(f"{out}my_images/")]
    assert len(predicted) == 2
    # Classes are the sorted folder names; predict() gives the best one by default, as tools/predict.py.
    names, labels = re.fullmatch(r"(\[.*?\]) (\[.*\])", lines[-1]).groups()
    labels = ast.literal_eval(labels)
    assert names == repr(sorted(CLASSES)) and len(labels) == 1 and set(labels) <= set(CLASSES)
