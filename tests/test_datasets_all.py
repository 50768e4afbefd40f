"""All 15 datasets and ObjectNet on miniature copies of their real layouts.

For each dataset: class count and names, split sizes, base/new subsampling and
relabelling, few-shot selection (equal to Dassl's sampler on the same lists, cached
under Dassl's file name), the zero-shot template and the YAML config.
"""
import math
import os
import random
import re

import pytest
import yaml

import datasets  # noqa: F401  (registers the dataset classes)
from mini_datasets import WRITERS, cfg_for
from vlprompt.data.datasets import DATASET_REGISTRY, build_dataset
from vlprompt.data.datasets.base_dataset import generate_fewshot_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Copied from the reference ZeroshotCLIP trainer (CoOp's CUSTOM_TEMPLATES).
TEMPLATES = {
    "OxfordPets": "a photo of a {}, a type of pet.",
    "OxfordFlowers": "a photo of a {}, a type of flower.",
    "FGVCAircraft": "a photo of a {}, a type of aircraft.",
    "DescribableTextures": "{} texture.",
    "EuroSAT": "a centered satellite photo of {}.",
    "StanfordCars": "a photo of a {}.",
    "Food101": "a photo of {}, a type of food.",
    "SUN397": "a photo of a {}.",
    "Caltech101": "a photo of a {}.",
    "UCF101": "a photo of a person doing {}.",
    "ImageNet": "a photo of a {}.",
    "ImageNetSketch": "a photo of a {}.",
    "ImageNetV2": "a photo of a {}.",
    "ImageNetA": "a photo of a {}.",
    "ImageNetR": "a photo of a {}.",
    "ObjectNet": "a photo of a {}.",
}
TEST_ONLY = {"ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR", "ObjectNet"}


def _sizes(dataset):
    return tuple(len(part) if part else 0 for part in (dataset.train_x, dataset.val, dataset.test))


def _consistent(dataset):
    """Every item's label indexes `classnames` and its class name agrees."""
    for part in (dataset.train_x, dataset.val or [], dataset.test):
        for item in part:
            assert dataset.classnames[item.label] == item.classname


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory):
    """One root holding all 16 miniature datasets (read-only for the tests below)."""
    root = tmp_path_factory.mktemp("data")
    return root, {stem: writer(str(root)) for stem, (_, writer) in WRITERS.items()}


@pytest.mark.parametrize("stem", list(WRITERS))
def test_dataset_on_miniature_layout(stem, mini_root, tmp_path):
    root, minis = mini_root
    name, _ = WRITERS[stem]
    mini = minis[stem]
    cls = DATASET_REGISTRY.get(name)

    with open(os.path.join(ROOT, "configs", "datasets", f"{stem}.yaml")) as f:
        assert yaml.safe_load(f) == {"DATASET": {"NAME": name}}
    assert cls.template == TEMPLATES[name]

    full = build_dataset(cfg_for(root, name))
    assert type(full) is cls
    assert full.classnames == mini.classnames
    assert full.num_classes == len(mini.classnames)
    assert _sizes(full) == mini.sizes
    assert sorted({item.label for item in full.test}) == list(range(len(mini.classnames)))
    _consistent(full)

    n_base = math.ceil(len(mini.classnames) / 2)
    base = build_dataset(cfg_for(root, name, subsample="base"))
    new = build_dataset(cfg_for(root, name, subsample="new"))
    if name in TEST_ONLY:  # SUBSAMPLE_CLASSES and NUM_SHOTS are ignored
        assert base.classnames == new.classnames == mini.classnames and _sizes(base) == mini.sizes
        assert not os.path.exists(os.path.join(full.dataset_dir, "split_fewshot"))
        shots = build_dataset(cfg_for(root, name, shots=1))
        assert _sizes(shots) == mini.sizes
        assert [d.impath for d in full.test] == [d.impath for d in full.train_x]
        return

    assert base.classnames == mini.classnames[:n_base]
    assert new.classnames == mini.classnames[n_base:]
    for part, subset, offset in ((base, "base", 0), (new, "new", n_base)):
        _consistent(part)
        assert sorted({d.label for d in part.test}) == list(range(len(part.classnames)))
        for got, everything in zip((part.train_x, part.val, part.test), (full.train_x, full.val, full.test)):
            kept = [d for d in everything if offset <= d.label < offset + len(part.classnames)]
            assert [(d.impath, d.label + offset) for d in got] == [(d.impath, d.label) for d in kept]

    random.seed(1)
    fewshot = build_dataset(cfg_for(root, name, shots=2, seed=1))
    random.seed(1)
    expected_train = generate_fewshot_dataset(full.train_x, num_shots=2)
    assert [d.impath for d in fewshot.train_x] == [d.impath for d in expected_train]
    assert len(fewshot.train_x) == 2 * len(mini.classnames)
    if name == "ImageNet":  # val = test, only train is sampled
        assert fewshot.val is fewshot.test and _sizes(fewshot)[2] == mini.sizes[2]
    else:
        expected_val = generate_fewshot_dataset(full.val, num_shots=2)
        assert [d.impath for d in fewshot.val] == [d.impath for d in expected_val]
        assert len(fewshot.test) == mini.sizes[2]
    cache = os.path.join(full.dataset_dir, "split_fewshot", "shot_2-seed_1.json")
    assert os.path.isfile(cache)

    random.seed(123)  # a cached selection does not depend on the random state any more
    again = build_dataset(cfg_for(root, name, shots=2, seed=1, subsample="new"))
    assert again.classnames == mini.classnames[n_base:]
    assert {d.impath for d in again.train_x} <= {d.impath for d in fewshot.train_x}
    assert len(again.train_x) == 2 * len(again.classnames)


def test_registered_names_are_the_benchmark_datasets():
    assert set(TEMPLATES) <= set(DATASET_REGISTRY.registered_names())
    assert {name for name, _ in WRITERS.values()} == set(TEMPLATES)


def test_datasets_md_table_matches_the_classes():
    """Every row of DATASETS.md's table names an existing YAML, the class's folder(s) and its published sizes."""
    with open(os.path.join(ROOT, "DATASETS.md")) as f:
        rows = [line.split("|")[1:-1] for line in f if line.startswith("| ") and ".yaml" in line]
    assert len(rows) == 16
    for row in rows:
        yaml_path = row[1].strip().strip("`")
        with open(os.path.join(ROOT, yaml_path)) as f:
            cls = DATASET_REGISTRY.get(yaml.safe_load(f)["DATASET"]["NAME"])
        assert f"`{cls.dataset_dir}/`" in row[2]
        assert all(f"`{alias}/`" in row[2] for alias in cls.dataset_dir_aliases)
        assert cls.layout.startswith(cls.dataset_dir + "/")
        sizes = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", row[4])]
        assert sizes == [n for n in cls.published_sizes if n is not None]
