"""Per-dataset rules: splits built from raw annotations, name rules, caches, layout errors."""
import json
import os
import pickle
import random
import sys
import types

import numpy as np
import pytest
import scipy.io

import datasets  # noqa: F401  (registers the dataset classes)
from datasets.stanford_cars import year_first
from datasets.sun397 import scene_name
from datasets.ucf101 import renamed_action
from mini_datasets import (
    IMAGENET_CLASSES,
    cfg_for,
    write_caltech101,
    write_classnames,
    write_image,
    write_imagenet,
    write_imagenet_a,
    write_imagenet_r,
    write_imagenetv2,
    write_text,
)
from vlprompt.data.datasets import DatasetLayoutError, Datum, build_dataset
from vlprompt.data.splits import read_split


def _split_json(path):
    with open(path) as f:
        return json.load(f)


def _rel(items, prefix):
    return [os.path.relpath(d.impath, prefix).replace(os.sep, "/") for d in items]


# ---------------------------------------------------------------- Caltech101

def test_caltech101_builds_split_ignoring_background_and_renaming(tmp_path, capsys):
    image_dir = tmp_path / "caltech-101" / "101_ObjectCategories"
    for folder in ["BACKGROUND_Google", "Faces", "Faces_easy", "Leopards", "Motorbikes", "airplanes", "yin_yang"]:
        for i in range(1, 11):
            write_image(str(image_dir / folder / f"image_{i:04d}.jpg"), i)
    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "Caltech101"))
    assert "Splitting into 50% train, 20% val, and 30% test" in capsys.readouterr().out
    assert dataset.classnames == ["face", "leopard", "motorbike", "airplane", "yin_yang"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (25, 10, 15)  # 5 / 2 / 3 per class
    stored = _split_json(tmp_path / "caltech-101" / "split_zhou_Caltech101.json")
    assert list(stored) == ["train", "val", "test"]
    assert all(len(e) == 3 and e[0].count("/") == 1 and not e[0].startswith("/") for e in stored["train"])
    assert {(e[0].split("/")[0], e[1], e[2]) for e in stored["test"]} == {
        ("Faces", 0, "face"), ("Leopards", 1, "leopard"), ("Motorbikes", 2, "motorbike"),
        ("airplanes", 3, "airplane"), ("yin_yang", 4, "yin_yang"),
    }


# ---------------------------------------------------------------- StanfordCars (.mat files)

def _cars_annotations(entries):
    """A 1xN MATLAB struct array like cars_train_annos.mat's "annotations" (fields as in the devkit)."""
    fields = ["bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname"]
    array = np.zeros((1, len(entries)), dtype=[(field, "O") for field in fields])
    for i, (fname, class_id) in enumerate(entries):
        array[0, i] = (np.array([[1]]), np.array([[2]]), np.array([[30]]), np.array([[20]]),
                       np.array([[class_id]], dtype=np.uint8), np.array([fname]))
    return array


def _write_cars_devkit(base, train, test, class_names):
    os.makedirs(base / "devkit", exist_ok=True)
    meta = np.empty((1, len(class_names)), dtype=object)
    meta[0, :] = class_names
    scipy.io.savemat(str(base / "devkit" / "cars_meta.mat"), {"class_names": meta})
    scipy.io.savemat(str(base / "devkit" / "cars_train_annos.mat"), {"annotations": _cars_annotations(train)})
    scipy.io.savemat(str(base / "cars_test_annos_withlabels.mat"), {"annotations": _cars_annotations(test)})


def test_stanford_cars_builds_split_from_mat_files(tmp_path, capsys):
    base = tmp_path / "stanford_cars"
    names = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi V8 Sedan 1994"]
    train = [(f"{i:05d}.jpg", 1 + (i % 3)) for i in range(1, 16)]  # 5 per class, classes 1-based
    test = [(f"{i:05d}.jpg", 1 + (i % 3)) for i in range(1, 7)]
    for fname, _ in train:
        write_image(str(base / "cars_train" / fname))
    for fname, _ in test:
        write_image(str(base / "cars_test" / fname))
    _write_cars_devkit(base, train, test, names)

    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "StanfordCars"))
    assert "Splitting trainval into 80% train and 20% val" in capsys.readouterr().out
    assert dataset.classnames == ["2000 AM General Hummer SUV", "2012 Acura RL Sedan", "1994 Audi V8 Sedan"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (12, 3, 6)
    first_two = [(d.label, os.path.basename(d.impath)) for d in dataset.test[:2]]
    assert first_two == [(1, "00001.jpg"), (2, "00002.jpg")]
    stored = _split_json(base / "split_zhou_StanfordCars.json")
    assert stored["test"][0] == ["cars_test/00001.jpg", 1, "2012 Acura RL Sedan"]
    assert all(e[0].startswith("cars_train/") for e in stored["train"] + stored["val"])
    assert year_first("Audi V8 Sedan 1994") == "1994 Audi V8 Sedan"


def test_missing_scipy_is_named_when_a_split_has_to_be_built(tmp_path, monkeypatch):
    base = tmp_path / "stanford_cars"
    write_image(str(base / "cars_train" / "00001.jpg"))
    write_image(str(base / "cars_test" / "00001.jpg"))
    _write_cars_devkit(base, [("00001.jpg", 1)], [("00001.jpg", 1)], ["Audi V8 Sedan 1994"])
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # makes "from scipy.io import loadmat" fail
    with pytest.raises(DatasetLayoutError, match=r"needs SciPy .*pip install scipy.*published split file"):
        build_dataset(cfg_for(tmp_path, "StanfordCars"))


# ---------------------------------------------------------------- OxfordFlowers (.mat labels)

def test_oxford_flowers_builds_split_from_imagelabels(tmp_path, capsys):
    base = tmp_path / "oxford_flowers"
    labels = [2, 1, 2, 1, 2, 1, 2, 1, 2, 1] * 2  # 1-based, label 2 appears first
    for i in range(len(labels)):
        write_image(str(base / "jpg" / f"image_{i + 1:05d}.jpg"), i)
    scipy.io.savemat(str(base / "imagelabels.mat"), {"labels": np.array([labels], dtype=np.uint8)})
    with open(base / "cat_to_name.json", "w") as f:
        json.dump({"1": "pink primrose", "2": "hard-leaved pocket orchid"}, f)

    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "OxfordFlowers"))
    assert "Splitting data into 50% train, 20% val, and 30% test" in capsys.readouterr().out
    assert dataset.classnames == ["pink primrose", "hard-leaved pocket orchid"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (10, 4, 6)
    assert dataset.train_x[0].label == 1  # groups in order of first appearance
    for item in dataset.train_x + dataset.val + dataset.test:
        index = int(os.path.basename(item.impath)[6:11]) - 1
        assert item.label == labels[index] - 1
    stored = _split_json(base / "split_zhou_OxfordFlowers.json")
    assert all(e[0].startswith("image_") and "/" not in e[0] for e in stored["test"])


# ---------------------------------------------------------------- Food101

def test_food101_folder_split(tmp_path):
    for name in ["beet_salad", "apple_pie"]:
        for i in range(10):
            write_image(str(tmp_path / "food-101" / "images" / name / f"{3000 + i}.jpg"), i)
    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "Food101"))
    assert dataset.classnames == ["apple_pie", "beet_salad"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (10, 4, 6)
    stored = _split_json(tmp_path / "food-101" / "split_zhou_Food101.json")
    assert stored["val"][0][0].startswith("apple_pie/")


# ---------------------------------------------------------------- FGVCAircraft

def test_fgvc_aircraft_unknown_variant_is_named(tmp_path):
    base = tmp_path / "fgvc_aircraft"
    write_image(str(base / "images" / "1234567.jpg"))
    write_text(str(base / "variants.txt"), ["F-16A/B", "Falcon 2000"])
    for part in ("train", "val", "test"):
        write_text(str(base / f"images_variant_{part}.txt"), ["1234567 Falcon 2000"])
    dataset = build_dataset(cfg_for(tmp_path, "FGVCAircraft"))
    assert [(d.label, d.classname) for d in dataset.test] == [(1, "Falcon 2000")]
    write_text(str(base / "images_variant_val.txt"), ["1234567 Falcon 900"])
    with pytest.raises(DatasetLayoutError, match=r'images_variant_val.txt, line 1: the variant "Falcon 900"'):
        build_dataset(cfg_for(tmp_path, "FGVCAircraft"))


# ---------------------------------------------------------------- SUN397

def test_sun397_builds_split_from_partition_1(tmp_path):
    base = tmp_path / "sun397"
    categories = ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop"]
    write_text(str(base / "ClassName.txt"), categories)
    train_lines, test_lines = [], []
    for category in reversed(categories):  # list order differs from label order
        for i in range(5):
            path = f"{category}/sun_{'abcde'[i]}{len(category)}.jpg"
            write_image(str(base / "SUN397" / path[1:]), i)
            (train_lines if i < 4 else test_lines).append(path)
    write_text(str(base / "Training_01.txt"), train_lines)
    write_text(str(base / "Testing_01.txt"), test_lines)
    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "SUN397"))
    assert dataset.classnames == ["abbey", "outdoor apartment_building", "shop bakery"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (9, 3, 3)  # round(4 * 0.2) = 1 val
    stored = _split_json(base / "split_zhou_SUN397.json")
    assert ["b/bakery/shop/sun_e14.jpg", 2, "shop bakery"] in stored["test"]
    assert scene_name("c/cathedral/indoor") == "indoor cathedral"


# ---------------------------------------------------------------- UCF101

def test_ucf101_builds_split_from_official_lists_with_renamed_folders(tmp_path):
    base = tmp_path / "ucf101"
    actions = [(1, "ApplyEyeMakeup"), (2, "Archery"), (101, "YoYo")]
    write_text(str(base / "ucfTrainTestlist" / "classInd.txt"), [f"{i} {a}" for i, a in actions], newline="\r\n")
    train, test = [], []
    for index, action in actions:
        for group in range(1, 7):
            video = f"v_{action}_g{group:02d}_c01"
            write_image(str(base / "UCF-101-midframes" / renamed_action(action) / f"{video}.jpg"), group)
            if group <= 5:
                train.append(f"{action}/{video}.avi {index}")
            else:
                test.append(f"{action}/{video}.avi")
    write_text(str(base / "ucfTrainTestlist" / "trainlist01.txt"), train, newline="\r\n")
    write_text(str(base / "ucfTrainTestlist" / "testlist01.txt"), test, newline="\r\n")
    random.seed(0)
    dataset = build_dataset(cfg_for(tmp_path, "UCF101"))
    assert dataset.classnames == ["Apply_Eye_Makeup", "Archery", "Yo_Yo"]
    assert dataset.num_classes == 101  # labels are classInd.txt index - 1
    assert sorted(dataset.lab2cname) == [0, 1, 100]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (12, 3, 3)
    stored = _split_json(base / "split_zhou_UCF101.json")
    assert ["Yo_Yo/v_YoYo_g06_c01.jpg", 100, "Yo_Yo"] in stored["test"]
    (base / "split_zhou_UCF101.json").unlink()
    write_text(str(base / "ucfTrainTestlist" / "testlist01.txt"), test[:1] + ["YoYo_v_YoYo_g06_c01.avi"])
    with pytest.raises(DatasetLayoutError, match=r'testlist01.txt, line 2: "YoYo_v_YoYo_g06_c01.avi" is not a line '
                                                 r'"ACTION/VIDEO.avi \[LABEL\]"'):
        build_dataset(cfg_for(tmp_path, "UCF101"))


# ---------------------------------------------------------------- ImageNet

def test_imagenet_lists_folders_once_then_reads_its_cache(tmp_path):
    write_imagenet(str(tmp_path))
    base = tmp_path / "imagenet"
    first = build_dataset(cfg_for(tmp_path, "ImageNet"))
    assert first.classnames == [name for _, name in IMAGENET_CLASSES]
    assert first.val is first.test
    cache = base / "preprocessed.json"
    assert cache.is_file()
    # The cache fixes the order: a reordered cache is used as is, not re-listed.
    with open(cache) as f:
        data = json.load(f)
    data["train"].reverse()
    with open(cache, "w") as f:
        json.dump(data, f)
    second = build_dataset(cfg_for(tmp_path, "ImageNet"))
    assert [d.impath for d in second.train_x] == [d.impath for d in reversed(first.train_x)]


@pytest.fixture
def dassl_datum(monkeypatch):
    """A class that pickles as dassl.data.datasets.base_dataset.Datum (Dassl's instance attributes)."""

    class DasslDatum:
        def __init__(self, impath, label, classname):
            self._impath, self._label, self._domain, self._classname = impath, label, 0, classname

    DasslDatum.__module__ = "dassl.data.datasets.base_dataset"
    DasslDatum.__qualname__ = DasslDatum.__name__ = "Datum"
    names = ["dassl", "dassl.data", "dassl.data.datasets", "dassl.data.datasets.base_dataset"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["dassl.data.datasets.base_dataset"].Datum = DasslDatum
    return DasslDatum


def _dassl_pickle(path, payload):
    with open(path, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path, "rb") as f:
        assert b"dassl.data.datasets.base_dataset" in f.read()


def test_imagenet_reads_dassl_preprocessed_pkl_from_another_machine(tmp_path, dassl_datum):
    write_imagenet(str(tmp_path))
    base = tmp_path / "imagenet"
    foreign = "/mnt/cluster/datasets/imagenet/images"
    train = [dassl_datum(f"{foreign}/train/{wnid}/{wnid}_1001.JPEG", label, name)
             for label, (wnid, name) in enumerate(IMAGENET_CLASSES)]
    test = [dassl_datum(f"{foreign}/val/n01443537/ILSVRC2012_val_00000010.JPEG", 1, "goldfish")]
    _dassl_pickle(base / "preprocessed.pkl", {"train": train, "test": test})
    del sys.modules["dassl.data.datasets.base_dataset"]  # reading must not need Dassl

    dataset = build_dataset(cfg_for(tmp_path, "ImageNet"))
    assert all(type(d) is Datum for d in dataset.train_x)
    assert [d.impath for d in dataset.test] == [str(base / "images/val/n01443537/ILSVRC2012_val_00000010.JPEG")]
    assert len(dataset.train_x) == 5 and dataset.train_x[2].classname == "great white shark"
    assert not (base / "preprocessed.json").exists()


def test_dassl_fewshot_pickle_is_read_by_a_dataset(tmp_path, dassl_datum, capsys):
    write_caltech101(str(tmp_path))
    base = tmp_path / "caltech-101"
    train, val, _ = read_split(str(base / "split_zhou_Caltech101.json"), str(base / "101_ObjectCategories"))
    moved = "/home/someone/data/caltech-101/101_ObjectCategories"
    picked_train = [train[4], train[0], train[8]]
    payload = {
        "train": [dassl_datum(d.impath.replace(str(base / "101_ObjectCategories"), moved), d.label, d.classname)
                  for d in picked_train],
        "val": [dassl_datum(d.impath, d.label, d.classname) for d in val[:2]],
    }
    os.makedirs(base / "split_fewshot")
    _dassl_pickle(base / "split_fewshot" / "shot_1-seed_3.pkl", payload)
    del sys.modules["dassl.data.datasets.base_dataset"]

    dataset = build_dataset(cfg_for(tmp_path, "Caltech101", shots=1, seed=3))
    assert "Loading preprocessed few-shot data from" in capsys.readouterr().out
    assert [d.impath for d in dataset.train_x] == [d.impath for d in picked_train]
    assert [d.impath for d in dataset.val] == [d.impath for d in val[:2]]


def test_imagenet_val_folders_must_match_train(tmp_path):
    write_imagenet(str(tmp_path))
    os.rename(tmp_path / "imagenet/images/val/n01440764", tmp_path / "imagenet/images/val_n01440764")
    with pytest.raises(DatasetLayoutError, match=r"images/val/ must hold the same class folders.*\['n01440764'\]"):
        build_dataset(cfg_for(tmp_path, "ImageNet"))


# ---------------------------------------------------------------- test-only variants

def test_imagenetv2_labels_follow_folder_numbers_not_string_order(tmp_path):
    write_imagenetv2(str(tmp_path), n_classes=12)
    dataset = build_dataset(cfg_for(tmp_path, "ImageNetV2"))
    tens = [d for d in dataset.test if os.path.basename(os.path.dirname(d.impath)) == "10"]
    assert {(d.label, d.classname) for d in tens} == {(10, "class 10")}
    os.rename(tmp_path / "imagenetv2/imagenetv2-matched-frequency-format-val/7", tmp_path / "imagenetv2/seven")
    with pytest.raises(DatasetLayoutError, match=r"folders 0 … 11.*missing: \['7'\]"):
        build_dataset(cfg_for(tmp_path, "ImageNetV2"))


def test_imagenet_a_is_200_of_1000_with_fork_folder_name(tmp_path):
    mini = write_imagenet_a(str(tmp_path), folder="imagenet-a")  # RAda's folder name
    dataset = build_dataset(cfg_for(tmp_path, "ImageNetA"))
    assert dataset.classnames == ["goldfish", "tiger shark", "hammerhead shark"] == mini.classnames
    assert dataset.dataset_dir == str(tmp_path / "imagenet-a")
    assert all(" _ " in os.path.basename(d.impath) for d in dataset.test)  # real names hold spaces


def test_imagenet_r_missing_everywhere_names_both_folders(tmp_path):
    with pytest.raises(DatasetLayoutError) as info:
        build_dataset(cfg_for(tmp_path, "ImageNetR"))
    message = str(info.value)
    assert 'no folder "imagenet-rendition" or "imagenet-r" found' in message and "DATASETS.md" in message
    write_imagenet_r(str(tmp_path))
    write_classnames(str(tmp_path / "imagenet-rendition" / "classnames.txt"), IMAGENET_CLASSES[:1])
    with pytest.raises(DatasetLayoutError, match=r"class folder\(s\) of .*imagenet-r have no line in "
                                                 r".*classnames.txt \(first: n01491361\)"):
        build_dataset(cfg_for(tmp_path, "ImageNetR"))


# ---------------------------------------------------------------- errors at train time

@pytest.mark.parametrize("moved, named", [
    ("caltech-101", 'no folder "caltech-101" found'),  # dataset missing
    ("caltech-101/101_ObjectCategories/Leopards", "101_ObjectCategories/Leopards/image_0001.jpg"),  # partial
])
def test_train_py_names_the_missing_path_and_datasets_md(tmp_path, tiny_clip_files, capsys, moved, named):
    from vlprompt_app.commands import train

    write_caltech101(str(tmp_path))
    os.rename(tmp_path / moved, tmp_path / "elsewhere")
    config, weights = tiny_clip_files
    argv = ["--root", str(tmp_path), "--trainer", "ZeroshotCLIP", "--dataset-config-file",
            "configs/datasets/caltech101.yaml", "--config-file", "configs/trainers/CoOp/toy.yaml",
            "--output-dir", str(tmp_path / "out"), "--eval-only",
            "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights]
    assert train.run(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "DATASETS.md" in err and "Traceback" not in err
