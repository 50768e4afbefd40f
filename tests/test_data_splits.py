"""CoOp split helpers: split JSON, trainval split, folder split, base/new subsampling."""
import json
import os
import random

import pytest

from vlprompt.data.datasets import Datum, MissingImagesError
from vlprompt.data.splits import (
    read_and_split_data,
    read_split,
    save_split,
    split_trainval,
    subsample_classes,
)
from vlprompt.utils import listdir_nohidden


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    return str(path)


def _triples(items, prefix=""):
    return [(os.path.relpath(d.impath, prefix) if prefix else d.impath, d.label, d.classname) for d in items]


# ---------------------------------------------------------------- subsample_classes

def _labelled(labels):
    return [Datum.unchecked(f"img_{i}_{label}.jpg", label, 5, f"class{label}") for i, label in enumerate(labels)]


def test_subsample_odd_class_count_gives_base_the_larger_half(capsys):
    train = _labelled([9, 1, 5, 3, 7, 1])  # 5 classes: base = 1, 3, 5; new = 7, 9
    val = _labelled([1, 9, 7, 3])
    test = _labelled([5, 9, 2, 1])  # label 2 is not a training class: dropped in both halves

    base_train, base_val, base_test = subsample_classes(train, val, test, subsample="base")
    assert capsys.readouterr().out == "SUBSAMPLE BASE CLASSES!\n"
    assert [(d.label, d.classname) for d in base_train] == [(0, "class1"), (2, "class5"), (1, "class3"), (0, "class1")]
    assert [(d.label, d.classname) for d in base_val] == [(0, "class1"), (1, "class3")]
    assert [(d.label, d.classname) for d in base_test] == [(2, "class5"), (0, "class1")]
    assert {d.domain for d in base_train + base_val + base_test} == {0}

    new_train, new_val, new_test = subsample_classes(train, val, test, subsample="new")
    assert capsys.readouterr().out == "SUBSAMPLE NEW CLASSES!\n"
    assert [(d.label, d.classname) for d in new_train] == [(1, "class9"), (0, "class7")]
    assert [(d.label, d.classname) for d in new_val] == [(1, "class9"), (0, "class7")]
    assert [(d.label, d.classname) for d in new_test] == [(1, "class9")]


def test_subsample_37_classes_splits_19_18():
    train = _labelled(list(range(37)))
    base, new = subsample_classes(train, train, subsample="base")[0], subsample_classes(train, subsample="new")[0]
    assert [d.label for d in base] == list(range(19))
    assert [d.label for d in new] == list(range(18))
    assert new[0].classname == "class19"


def test_subsample_all_returns_the_same_objects_and_bad_value_is_rejected(capsys):
    train, test = _labelled([0, 1]), _labelled([1])
    result = subsample_classes(train, test, subsample="all")
    assert result[0] is train and result[1] is test
    assert capsys.readouterr().out == ""
    expected = r"DATASET.SUBSAMPLE_CLASSES must be one of \['all', 'base', 'new'\], got \"Base\""
    with pytest.raises(ValueError, match=expected):
        subsample_classes(train, subsample="Base")


# ---------------------------------------------------------------- split JSON

def test_split_json_round_trip(tmp_path, capsys):
    prefix = str(tmp_path / "images")
    paths = [_touch(os.path.join(prefix, name)) for name in ("a/x1.jpg", "a/x2.jpg", "b/y1.jpg", "b/sub/y2.jpg")]
    train = [Datum(paths[0], 0, classname="a"), Datum(paths[2], 1, classname="b")]
    val = [Datum(paths[1], 0, classname="a")]
    test = [Datum(paths[3], 1, classname="b"), Datum(paths[0], 0, classname="a")]
    split_path = str(tmp_path / "splits" / "split_zhou_Toy.json")

    save_split(train, val, test, split_path, prefix)
    assert capsys.readouterr().out == f"Saved split to {split_path}\n"
    with open(split_path) as f:
        text = f.read()
    stored = json.loads(text)
    assert list(stored) == ["train", "val", "test"]
    assert stored["test"] == [["b/sub/y2.jpg", 1, "b"], ["a/x1.jpg", 0, "a"]]
    assert text.startswith('{\n    "train": [\n        [\n            "a/x1.jpg",\n            0,\n')

    read_train, read_val, read_test = read_split(split_path, prefix)
    assert capsys.readouterr().out == f"Reading split from {split_path}\n"
    for original, loaded in ((train, read_train), (val, read_val), (test, read_test)):
        assert _triples(loaded) == _triples(original)
    assert all(d.domain == 0 and isinstance(d.label, int) for d in read_train + read_val + read_test)


def test_read_split_reports_missing_images_once(tmp_path):
    prefix = str(tmp_path / "images")
    present = _touch(os.path.join(prefix, "ok.jpg"))
    missing = [f"gone{i}.jpg" for i in range(7)]
    split = {"train": [["ok.jpg", 0, "c"]] + [[m, 0, "c"] for m in missing], "val": [], "test": []}
    split_path = str(tmp_path / "split.json")
    with open(split_path, "w") as f:
        json.dump(split, f)
    with pytest.raises(MissingImagesError) as info:
        read_split(split_path, prefix)
    message = str(info.value)
    assert "7 of 8 images" in message and split_path in message
    assert all(os.path.join(prefix, m) in message for m in missing[:5])
    assert os.path.join(prefix, missing[5]) not in message
    assert present not in message


def test_read_split_rejects_malformed_file(tmp_path):
    split_path = str(tmp_path / "split.json")
    with open(split_path, "w") as f:
        json.dump({"train": [["a.jpg", 0]], "val": [], "test": []}, f)
    with pytest.raises(ValueError, match=r'no valid "train" list'):
        read_split(split_path, str(tmp_path))


def test_read_split_names_entries_of_the_wrong_types(tmp_path):
    """Entries of the right length but the wrong types: one message naming them (a DatasetLayoutError, so
    train.py prints it with exit status 2), not a ValueError from int()."""
    from vlprompt.data.datasets import DatasetLayoutError
    from vlprompt.data.splits import SplitFileError

    split_path = str(tmp_path / "split.json")
    with open(split_path, "w") as f:
        json.dump({"train": [["x.png", "notint", "cls"], ["y.png", 1, "cls"], [3, 0, "cls"]], "val": [], "test": []}, f)
    with pytest.raises(SplitFileError) as info:
        read_split(split_path, str(tmp_path))
    assert isinstance(info.value, DatasetLayoutError) and isinstance(info.value, ValueError)
    assert str(info.value) == (
        f'Split file {split_path}: 2 entries of its "train" list have the wrong types (train[0] = ["x.png", '
        '"notint", "cls"]; train[2] = [3, 0, "cls"]); each entry is [relative_path (a string), label (an integer '
        ">= 0), classname (a string)]. Fix the file, or delete it to have the split made again.")


# ---------------------------------------------------------------- split_trainval

def test_split_trainval_rounds_per_class_and_shuffles(tmp_path, capsys):
    # class 7: 12 items -> round(2.4) = 2 val; class 3: 5 items -> round(1.0) = 1 val
    trainval = [
        Datum.unchecked(f"{label}_{i}", label, 0, str(label)) for label, n in ((7, 12), (3, 5)) for i in range(n)
    ]
    random.seed(0)
    train, val = split_trainval(trainval)
    assert capsys.readouterr().out == "Splitting trainval into 80% train and 20% val\n"
    assert [d.label for d in val] == [7, 7, 3]
    assert len(train) == 14 and {d.impath for d in train + val} == {d.impath for d in trainval}

    random.seed(0)
    order7 = list(range(12))
    random.shuffle(order7)
    order3 = list(range(12, 17))
    random.shuffle(order3)
    assert [d.impath for d in val] == [trainval[i].impath for i in order7[:2] + order3[:1]]
    assert [d.impath for d in train] == [trainval[i].impath for i in order7[2:] + order3[1:]]


def test_split_trainval_rejects_class_without_val_item():
    trainval = [Datum.unchecked(f"{i}", 4, 0, "tiny") for i in range(2)]  # round(0.4) = 0
    with pytest.raises(ValueError, match=r"class 4 has 2 item\(s\)"):
        split_trainval(trainval)


# ---------------------------------------------------------------- read_and_split_data

def _folder_tree(root, counts):
    for category, n in counts.items():
        for i in range(n):
            _touch(os.path.join(root, category, f"{category}_{i}.jpg"))
    _touch(os.path.join(root, ".hidden_dir", "x.jpg"))
    return str(root)


def test_read_and_split_data_sorts_categories_and_rounds(tmp_path, capsys):
    # n=7: round(3.5)=4 / round(1.4)=1 / 2;  n=5: round(2.5)=2 / round(1.0)=1 / 2
    image_dir = _folder_tree(tmp_path / "images", {"zebra": 7, "Apple": 5, "mango": 5, "skip": 9})
    random.seed(3)
    train, val, test = read_and_split_data(image_dir, ignored=["skip"], new_cnames={"Apple": "apple fruit"})
    assert capsys.readouterr().out == "Splitting into 50% train, 20% val, and 30% test\n"

    # capitalised names sort first; label = position
    assert sorted({(d.label, d.classname) for d in train}) == [(0, "apple fruit"), (1, "mango"), (2, "zebra")]
    counts = {label: [sum(d.label == label for d in part) for part in (train, val, test)] for label in range(3)}
    assert counts == {0: [2, 1, 2], 1: [2, 1, 2], 2: [4, 1, 2]}

    random.seed(3)
    expected_train = []
    for category in ("Apple", "mango", "zebra"):
        folder = os.path.join(image_dir, category)
        images = [os.path.join(folder, name) for name in listdir_nohidden(folder)]
        random.shuffle(images)
        expected_train += images[: round(len(images) * 0.5)]
    assert [d.impath for d in train] == expected_train


def test_read_and_split_data_rejects_too_small_category(tmp_path):
    image_dir = _folder_tree(tmp_path / "images", {"big": 10, "small": 2})
    with pytest.raises(ValueError, match=r'category "small".*2 image\(s\) give 1 train / 0 val / 1 test'):
        read_and_split_data(image_dir)
