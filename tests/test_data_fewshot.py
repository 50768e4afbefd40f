"""Datum, DatasetBase, few-shot sampling (bit-exact with Dassl) and the few-shot cache."""
import json
import os
import pickle
import random
import sys
import types

import pytest

from vlprompt.config import get_cfg_default
from vlprompt.data.datasets import DatasetBase, Datum, MissingImagesError
from vlprompt.data.splits import (
    UnsafePickleError,
    fewshot_cache_stem,
    load_fewshot_cache,
    prepare_coop_splits,
    read_datum_pickle,
)


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    return path


def _conformance_lists(root):
    """The train and val lists of the few-shot conformance example (files created under root)."""
    train = [
        Datum(_touch(os.path.join(root, f"c{y}", f"img{i}.jpg")), label=y, classname=f"c{y}")
        for i in range(6)
        for y in (2, 0, 1)
        if not (y == 1 and i >= 3)
    ]
    val = [
        Datum(_touch(os.path.join(root, f"c{y}", f"v{i}.jpg")), label=y, classname=f"c{y}")
        for y in range(3)
        for i in range(5)
    ]
    return train, val


def _names(items, root):
    return [os.path.relpath(item.impath, root).replace(os.sep, "/").rsplit(".", 1)[0] for item in items]


EXPECTED_TRAIN = "c2/img1 c2/img4 c2/img0 c2/img5 c0/img0 c0/img3 c0/img4 c0/img1 c1/img0 c1/img1 c1/img2".split()
EXPECTED_VAL = "c0/v3 c0/v1 c0/v0 c0/v4 c1/v0 c1/v3 c1/v1 c1/v4 c2/v3 c2/v2 c2/v4 c2/v0".split()


# ---------------------------------------------------------------- Datum / DatasetBase

def test_datum_stores_dassl_attribute_names(tmp_path):
    path = _touch(str(tmp_path / "a.jpg"))
    item = Datum(path, label=3, domain=1, classname="cat")
    assert (item.impath, item.label, item.domain, item.classname) == (path, 3, 1, "cat")
    assert vars(item) == {"_impath": path, "_label": 3, "_domain": 1, "_classname": "cat"}


def test_datum_rejects_missing_file_and_non_str(tmp_path):
    missing = str(tmp_path / "nope.jpg")
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        Datum(missing, label=0)
    with pytest.raises(TypeError, match="str"):
        Datum(123)
    assert Datum.unchecked(missing, 1, 0, "x").impath == missing


def test_datasetbase_derives_classes_from_train_x(tmp_path):
    train = [
        Datum.unchecked("a", 2, 0, "two"),
        Datum.unchecked("b", 0, 0, "zero"),
        Datum.unchecked("c", 2, 0, "two"),
    ]
    dataset = DatasetBase(train_x=train, val=[], test=train)
    assert dataset.num_classes == 3
    assert dataset.lab2cname == {2: "two", 0: "zero"}
    assert dataset.classnames == ["zero", "two"]
    assert dataset.train_u is None
    with pytest.raises(ValueError, match="train_x is empty"):
        DatasetBase(train_x=[], test=train)


def test_split_dataset_by_label_keeps_first_appearance_order():
    items = [Datum.unchecked(str(i), label, 0, "") for i, label in enumerate([5, 1, 5, 3, 1])]
    groups = DatasetBase.split_dataset_by_label(items)
    assert list(groups) == [5, 1, 3]
    assert [item.impath for item in groups[5]] == ["0", "2"]


# ---------------------------------------------------------------- few-shot conformance

def test_fewshot_conformance_example(tmp_path, capsys):
    train, val = _conformance_lists(str(tmp_path))
    dataset = DatasetBase(train_x=train)
    random.seed(1)
    fewshot_train = dataset.generate_fewshot_dataset(train, num_shots=4)
    fewshot_val = dataset.generate_fewshot_dataset(val, num_shots=min(4, 4))
    assert _names(fewshot_train, str(tmp_path)) == EXPECTED_TRAIN
    assert _names(fewshot_val, str(tmp_path)) == EXPECTED_VAL
    assert capsys.readouterr().out == "Creating a 4-shot dataset\nCreating a 4-shot dataset\n"


def test_fewshot_conformance_example_with_repeat(tmp_path):
    train, _ = _conformance_lists(str(tmp_path))
    random.seed(1)
    fewshot_train = DatasetBase(train_x=train).generate_fewshot_dataset(train, num_shots=4, repeat=True)
    assert _names(fewshot_train, str(tmp_path)) == EXPECTED_TRAIN[:8] + [
        "c1/img1",
        "c1/img2",
        "c1/img0",
        "c1/img0",
    ]


def test_fewshot_below_one_shot_returns_inputs_without_drawing(tmp_path, capsys):
    train, val = _conformance_lists(str(tmp_path))
    dataset = DatasetBase(train_x=train)
    state = random.getstate()
    assert dataset.generate_fewshot_dataset(train, num_shots=0) is train
    assert dataset.generate_fewshot_dataset(train, val, num_shots=-1) == (train, val)
    assert random.getstate() == state
    assert capsys.readouterr().out == ""


def test_fewshot_several_lists_in_one_call(tmp_path):
    train, val = _conformance_lists(str(tmp_path))
    random.seed(1)
    both = DatasetBase(train_x=train).generate_fewshot_dataset(train, val, num_shots=4)
    assert [_names(part, str(tmp_path)) for part in both] == [EXPECTED_TRAIN, EXPECTED_VAL]


# ---------------------------------------------------------------- cache via the pipeline

def _cfg(root, shots, seed, subsample="all"):
    cfg = get_cfg_default()
    cfg.DATASET.ROOT = str(root)
    cfg.DATASET.NUM_SHOTS = shots
    cfg.DATASET.SUBSAMPLE_CLASSES = subsample
    cfg.SEED = seed
    return cfg


def _dataset_dir_with_lists(tmp_path):
    dataset_dir = str(tmp_path / "toy")
    train, val = _conformance_lists(os.path.join(dataset_dir, "images"))
    os.makedirs(os.path.join(dataset_dir, "split_fewshot"))
    return dataset_dir, train, val


def test_pipeline_samples_then_caches_as_json(tmp_path, capsys):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    images = os.path.join(dataset_dir, "images")
    cache = os.path.join(dataset_dir, "split_fewshot", "shot_4-seed_1.json")
    assert fewshot_cache_stem(dataset_dir, 4, 1) + ".json" == cache

    random.seed(1)
    out_train, out_val, out_test = prepare_coop_splits(_cfg(tmp_path, 4, 1), dataset_dir, lambda: (train, val, val))
    assert _names(out_train, images) == EXPECTED_TRAIN
    assert _names(out_val, images) == EXPECTED_VAL
    assert out_test is val
    assert f"Saving preprocessed few-shot data to {cache}\n" in capsys.readouterr().out

    with open(cache) as f:
        stored = json.load(f)
    assert list(stored) == ["train", "val"]
    assert stored["train"][0] == ["images/c2/img1.jpg", 2, 0, "c2"]  # relative to the dataset folder

    random.seed(123)  # a cache hit must not depend on the random state
    again_train, again_val, _ = prepare_coop_splits(_cfg(tmp_path, 4, 1), dataset_dir, lambda: (train, val, val))
    assert f"Loading preprocessed few-shot data from {cache}\n" in capsys.readouterr().out
    assert [(d.impath, d.label, d.domain, d.classname) for d in again_train] == [
        (d.impath, d.label, d.domain, d.classname) for d in out_train
    ]
    assert _names(again_val, images) == EXPECTED_VAL


def test_pipeline_base_subsample_after_cache(tmp_path):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    random.seed(1)
    out_train, out_val, out_test = prepare_coop_splits(
        _cfg(tmp_path, 4, 1, subsample="base"), dataset_dir, lambda: (train, val, val)
    )
    # labels 0, 1, 2 -> base = {0, 1}; the cache still holds all three classes.
    assert _names(out_train, os.path.join(dataset_dir, "images")) == EXPECTED_TRAIN[4:]
    assert sorted({d.label for d in out_val}) == [0, 1]
    assert len(out_test) == 10
    with open(fewshot_cache_stem(dataset_dir, 4, 1) + ".json") as f:
        assert len(json.load(f)["train"]) == 11


def test_pipeline_train_only_sampling_for_datasets_without_val(tmp_path):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    random.seed(1)
    out_train, out_val, out_test = prepare_coop_splits(_cfg(tmp_path, 4, 7), dataset_dir, lambda: (train, None, val))
    assert out_val is None and out_test is val
    assert _names(out_train, os.path.join(dataset_dir, "images")) == EXPECTED_TRAIN
    with open(fewshot_cache_stem(dataset_dir, 4, 7) + ".json") as f:
        assert list(json.load(f)) == ["train"]


@pytest.mark.parametrize("shots", [0, -1])
def test_zero_or_minus_one_shots_use_every_training_image_and_say_so(tmp_path, capsys, shots):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    out_train, out_val, _ = prepare_coop_splits(_cfg(tmp_path, shots, 1), dataset_dir, lambda: (train, val, val))
    assert out_train is train and out_val is val
    assert f"DATASET.NUM_SHOTS is {shots}: all {len(train)} training images are used (no few-shot sampling)\n" in \
        capsys.readouterr().out
    assert os.listdir(os.path.join(dataset_dir, "split_fewshot")) == []


def test_unseeded_run_warns_that_cache_is_shared(tmp_path):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    with pytest.warns(UserWarning, match="shared by every unseeded 4-shot run"):
        prepare_coop_splits(_cfg(tmp_path, 4, -1), dataset_dir, lambda: (train, val, val))
    assert os.path.isfile(os.path.join(dataset_dir, "split_fewshot", "shot_4-seed_-1.json"))


# ---------------------------------------------------------------- Dassl pickles

@pytest.fixture
def fake_dassl_datum(monkeypatch):
    """A class importable as dassl.data.datasets.base_dataset.Datum, shaped like Dassl's."""

    class FakeDatum:
        def __init__(self, impath="", label=0, domain=0, classname=""):
            self._impath = impath
            self._label = label
            self._domain = domain
            self._classname = classname

    FakeDatum.__module__ = "dassl.data.datasets.base_dataset"
    FakeDatum.__qualname__ = FakeDatum.__name__ = "Datum"
    names = ["dassl", "dassl.data", "dassl.data.datasets", "dassl.data.datasets.base_dataset"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["dassl.data.datasets.base_dataset"].Datum = FakeDatum
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return FakeDatum


def test_dassl_pickle_cache_is_read_without_dassl(tmp_path, fake_dassl_datum, monkeypatch, capsys):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    random.seed(1)
    expected = DatasetBase(train_x=train).generate_fewshot_dataset(train, num_shots=4)
    payload = {
        "train": [fake_dassl_datum(d.impath, d.label, d.domain, d.classname) for d in expected],
        "val": [fake_dassl_datum(d.impath, d.label, d.domain, d.classname) for d in val[:4]],
    }
    pkl = fewshot_cache_stem(dataset_dir, 4, 1) + ".pkl"
    with open(pkl, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(pkl, "rb") as f:
        assert b"dassl.data.datasets.base_dataset" in f.read()
    for name in ["dassl", "dassl.data", "dassl.data.datasets", "dassl.data.datasets.base_dataset"]:
        monkeypatch.delitem(sys.modules, name)

    out_train, out_val, _ = prepare_coop_splits(_cfg(tmp_path, 4, 1), dataset_dir, lambda: (train, val, val))
    assert f"Loading preprocessed few-shot data from {pkl}" in capsys.readouterr().out
    assert all(type(d) is Datum for d in out_train + out_val)
    assert _names(out_train, os.path.join(dataset_dir, "images")) == EXPECTED_TRAIN
    assert [(d.label, d.domain, d.classname) for d in out_val] == [(0, 0, "c0")] * 4
    assert not os.path.exists(fewshot_cache_stem(dataset_dir, 4, 1) + ".json")


def test_pickle_referencing_other_globals_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = str(tmp_path / "shot_1-seed_1.pkl")
    with open(path, "wb") as f:
        pickle.dump({"train": [Exploit()]}, f)
    with pytest.raises(UnsafePickleError, match=r"Refusing to unpickle .*shot_1-seed_1.pkl.*(posix|os)\.system"):
        read_datum_pickle(path)
    assert not marker.exists()


def test_cache_paths_from_another_machine_are_rewritten(tmp_path):
    dataset_dir, train, val = _dataset_dir_with_lists(tmp_path)
    images = os.path.join(dataset_dir, "images")
    foreign = {
        "train": [["/home/alice/data/toy/images/c0/img0.jpg", 0, 0, "c0"]],
        "val": [["/home/alice/data/toy/images/c1/v2.jpg", 1, 0, "c1"]],
    }
    with open(fewshot_cache_stem(dataset_dir, 2, 3) + ".json", "w") as f:
        json.dump(foreign, f)
    data = load_fewshot_cache(dataset_dir, 2, 3)
    assert data["train"][0].impath == os.path.join(images, "c0", "img0.jpg")
    assert data["val"][0].impath == os.path.join(images, "c1", "v2.jpg")


def test_cache_with_unfindable_path_names_file_and_path(tmp_path):
    dataset_dir, _, _ = _dataset_dir_with_lists(tmp_path)
    cache = fewshot_cache_stem(dataset_dir, 2, 3) + ".json"
    with open(cache, "w") as f:
        json.dump({"train": [["/elsewhere/toy/images/c9/gone.jpg", 0, 0, "c9"]], "val": []}, f)
    with pytest.raises(MissingImagesError) as info:
        load_fewshot_cache(dataset_dir, 2, 3)
    message = str(info.value)
    assert "1 of 1 images" in message
    assert "/elsewhere/toy/images/c9/gone.jpg" in message
    assert cache in message
