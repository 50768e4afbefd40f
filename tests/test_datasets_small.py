"""OxfordPets, DescribableTextures and EuroSAT on miniature layouts."""
import json
import os
import random

import pytest
from mini_datasets import cfg_for
from PIL import Image

import datasets  # noqa: F401  (registers the dataset classes)
from datasets.dtd import DescribableTextures
from datasets.eurosat import NEW_CNAMES, EuroSAT
from datasets.oxford_pets import OxfordPets
from vlprompt.data import splits
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, DatasetLayoutError, build_dataset


def _jpeg(path, shade=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (8, 8), (shade, 255 - shade, 128)).save(path, "JPEG")


# ---------------------------------------------------------------- OxfordPets

PET_CLASSES = [("Abyssinian", 1, 1), ("american_bulldog", 2, 2), ("Egyptian_Mau", 3, 1)]


def _pets_tree(root, n_trainval=5, n_test=2):
    """oxford_pets/ with images/ and the official annotation lists (no split JSON)."""
    base = os.path.join(root, "oxford_pets")
    lines = {"trainval.txt": [], "test.txt": []}
    for breed, class_id, species in PET_CLASSES:
        for i in range(1, n_trainval + n_test + 1):
            image = f"{breed}_{i}"
            _jpeg(os.path.join(base, "images", image + ".jpg"), shade=10 * i)
            split = "trainval.txt" if i <= n_trainval else "test.txt"
            lines[split].append(f"{image} {class_id} {species} {i}")
    os.makedirs(os.path.join(base, "annotations"))
    for name, content in lines.items():
        with open(os.path.join(base, "annotations", name), "w") as f:
            f.write("\n".join(content) + "\n")
    return base


def test_oxford_pets_builds_split_from_annotations_then_reads_it(tmp_path, capsys):
    base = _pets_tree(tmp_path)
    random.seed(0)
    dataset = OxfordPets(cfg_for(tmp_path, "OxfordPets"))
    split_path = os.path.join(base, "split_zhou_OxfordPets.json")
    out = capsys.readouterr().out
    assert "Splitting trainval into 80% train and 20% val" in out
    assert f"Saved split to {split_path}" in out

    assert dataset.dataset_dir == base and os.path.isdir(os.path.join(base, "split_fewshot"))
    assert dataset.classnames == ["abyssinian", "american_bulldog", "egyptian_mau"]
    assert dataset.num_classes == 3
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (12, 3, 6)  # round(5 * 0.2) = 1 val / class
    assert dataset.test[0].impath == os.path.join(base, "images", "Abyssinian_6.jpg")
    assert {(d.label, d.classname) for d in dataset.test} == {
        (0, "abyssinian"),
        (1, "american_bulldog"),
        (2, "egyptian_mau"),
    }

    with open(split_path) as f:
        stored = json.load(f)
    assert stored["test"][0] == ["Abyssinian_6.jpg", 0, "abyssinian"]

    reread = OxfordPets(cfg_for(tmp_path, "OxfordPets"))
    assert f"Reading split from {split_path}" in capsys.readouterr().out
    assert [d.impath for d in reread.train_x] == [d.impath for d in dataset.train_x]


def test_oxford_pets_reads_published_split_json_and_subsamples(tmp_path):
    base = _pets_tree(tmp_path)
    split = {
        "train": [["Abyssinian_1.jpg", 0, "abyssinian"], ["american_bulldog_1.jpg", 1, "american_bulldog"],
                  ["Egyptian_Mau_1.jpg", 2, "egyptian_mau"], ["Egyptian_Mau_2.jpg", 2, "egyptian_mau"]],
        "val": [["Abyssinian_2.jpg", 0, "abyssinian"], ["Egyptian_Mau_3.jpg", 2, "egyptian_mau"]],
        "test": [["Egyptian_Mau_6.jpg", 2, "egyptian_mau"], ["Abyssinian_6.jpg", 0, "abyssinian"]],
    }
    with open(os.path.join(base, "split_zhou_OxfordPets.json"), "w") as f:
        json.dump(split, f)
    new = build_dataset(cfg_for(tmp_path, "OxfordPets", subsample="new"))
    assert new.classnames == ["egyptian_mau"]
    assert [os.path.basename(d.impath) for d in new.train_x] == ["Egyptian_Mau_1.jpg", "Egyptian_Mau_2.jpg"]
    assert [d.label for d in new.val + new.test] == [0, 0]


def test_oxford_pets_keeps_coop_static_helpers():
    assert OxfordPets.read_split is splits.read_split
    assert OxfordPets.save_split is splits.save_split
    assert OxfordPets.split_trainval is splits.split_trainval
    assert OxfordPets.subsample_classes is splits.subsample_classes
    assert DescribableTextures.read_and_split_data is splits.read_and_split_data


def test_templates_and_registration():
    assert OxfordPets.template == "a photo of a {}, a type of pet."
    assert DescribableTextures.template == "{} texture."
    assert EuroSAT.template == "a centered satellite photo of {}."
    assert {"OxfordPets", "DescribableTextures", "EuroSAT"} <= set(DATASET_REGISTRY.registered_names())
    assert DATASET_REGISTRY.get("EuroSAT") is EuroSAT


# ---------------------------------------------------------------- EuroSAT

EUROSAT_FOLDERS = ["SeaLake", "AnnualCrop", "Forest", "HerbaceousVegetation", "Highway",
                   "Industrial", "Pasture", "PermanentCrop", "Residential", "River"]


def _eurosat_tree(root, per_class=4):
    for folder in EUROSAT_FOLDERS:
        for i in range(1, per_class + 1):
            _jpeg(os.path.join(root, "eurosat", "2750", folder, f"{folder}_{i}.jpg"), shade=i)
    return os.path.join(root, "eurosat")


def test_eurosat_maps_folder_names_and_splits_base_new(tmp_path):
    base = _eurosat_tree(tmp_path)
    random.seed(0)
    full = EuroSAT(cfg_for(tmp_path, "EuroSAT"))
    assert full.classnames == [
        "Annual Crop Land", "Forest", "Herbaceous Vegetation Land", "Highway or Road", "Industrial Buildings",
        "Pasture Land", "Permanent Crop Land", "Residential Buildings", "River", "Sea or Lake",
    ]
    # 4 images per class: round(2.0) = 2 train, round(0.8) = 1 val, 1 test
    assert (len(full.train_x), len(full.val), len(full.test)) == (20, 10, 10)
    with open(os.path.join(base, "split_zhou_EuroSAT.json")) as f:
        stored = json.load(f)
    assert {tuple(entry[1:]) for entry in stored["test"]} == {(i, name) for i, name in enumerate(full.classnames)}
    for relative, label, classname in stored["train"]:
        folder, filename = relative.split("/")
        assert filename.startswith(f"{folder}_") and classname == NEW_CNAMES[folder]
        assert label == sorted(EUROSAT_FOLDERS).index(folder)

    base_ds = EuroSAT(cfg_for(tmp_path, "EuroSAT", subsample="base"))
    new_ds = EuroSAT(cfg_for(tmp_path, "EuroSAT", subsample="new"))
    assert base_ds.classnames == full.classnames[:5]
    assert new_ds.classnames == full.classnames[5:]
    assert sorted({d.label for d in new_ds.test}) == [0, 1, 2, 3, 4]


def test_eurosat_few_shot_uses_cache_name(tmp_path):
    base = _eurosat_tree(tmp_path)
    random.seed(2)
    dataset = EuroSAT(cfg_for(tmp_path, "EuroSAT", shots=1, seed=2))
    assert len(dataset.train_x) == 10 and len(dataset.val) == 10
    assert os.listdir(os.path.join(base, "split_fewshot")) == ["shot_1-seed_2.json"]


# ---------------------------------------------------------------- DTD

def test_dtd_folder_split_when_json_missing(tmp_path, capsys):
    for category, n in (("banded", 10), ("blotchy", 10)):
        for i in range(1, n + 1):
            _jpeg(os.path.join(tmp_path, "dtd", "images", category, f"{category}_{i:04d}.jpg"), shade=i)
    split_path = os.path.join(tmp_path, "dtd", "split_zhou_DescribableTextures.json")
    random.seed(0)
    dataset = DescribableTextures(cfg_for(tmp_path, "DescribableTextures"))
    out = capsys.readouterr().out
    assert "Splitting into 50% train, 20% val, and 30% test" in out
    assert f"Saved split to {split_path}" in out
    assert dataset.classnames == ["banded", "blotchy"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (10, 4, 6)
    with open(split_path) as f:
        stored = json.load(f)
    assert all(entry[0].startswith(f"{entry[2]}/{entry[2]}_") for entry in stored["train"])


# ---------------------------------------------------------------- layout errors

def test_missing_dataset_folder_prints_layout(tmp_path):
    with pytest.raises(DatasetLayoutError) as info:
        OxfordPets(cfg_for(tmp_path, "OxfordPets"))
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert message.startswith('Dataset OxfordPets: no folder "oxford_pets" found;')
    assert f'DATASET.ROOT is "{tmp_path}"' in message
    assert message.endswith("Expected layout under DATASET.ROOT:\n" + OxfordPets.layout)


def test_missing_split_and_annotations_are_named(tmp_path):
    os.makedirs(os.path.join(tmp_path, "oxford_pets", "images"))
    with pytest.raises(DatasetLayoutError, match=r"lacks split_zhou_OxfordPets.json \(or, to build it, "
                       r"annotations/trainval.txt, annotations/test.txt\)"):
        OxfordPets(cfg_for(tmp_path, "OxfordPets"))


def test_missing_image_folder_is_named(tmp_path):
    os.makedirs(os.path.join(tmp_path, "eurosat"))
    with pytest.raises(DatasetLayoutError, match=r"the folder .*eurosat lacks 2750;") as info:
        EuroSAT(cfg_for(tmp_path, "EuroSAT"))
    assert "2750/AnnualCrop/AnnualCrop_1.jpg" in str(info.value)


def test_empty_root_is_explained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetLayoutError, match="DATASET.ROOT is empty, so the current folder .* was searched"):
        DescribableTextures(cfg_for("", "DescribableTextures"))


def test_unknown_dataset_name_lists_registered_names(tmp_path):
    with pytest.raises(ValueError, match=r"but got \[EuroSat\] \(do you mean \[EuroSAT\]\?\)") as info:
        build_dataset(cfg_for(tmp_path, "EuroSat"))
    assert "'OxfordPets'" in str(info.value) and "'DescribableTextures'" in str(info.value)


class _TwoFolderNames(DatasetBase):
    """A dataset whose folder has a CoOp name and a fork's name (like ImageNet-A)."""

    dataset_dir = "imagenet-adversarial"
    layout = "imagenet-adversarial/\n  imagenet-a/<wnid>/…"


def test_alternative_folder_names_are_tried_in_order(tmp_path):
    dataset = _TwoFolderNames.__new__(_TwoFolderNames)
    cfg = cfg_for(tmp_path, "_TwoFolderNames")
    names = ["imagenet-adversarial", "imagenet-a"]
    with pytest.raises(DatasetLayoutError, match='no folder "imagenet-adversarial" or "imagenet-a" found'):
        dataset.find_dataset_dir(cfg, folders=names)
    os.makedirs(tmp_path / "imagenet-a" / "imagenet-a")
    assert dataset.find_dataset_dir(cfg, required=["imagenet-a"], folders=names) == str(tmp_path / "imagenet-a")
    assert dataset.dataset_dir == str(tmp_path / "imagenet-a")
    assert not os.path.exists(tmp_path / "imagenet-a" / "split_fewshot")
