"""The ImageFolder dataset (datasets/image_folder.py, vlprompt/data/image_tree.py): the user's own
images as class folders, a CSV or JSON list and a names file; the split made once and read back;
a given split file; every refused input with its message and nothing written; few-shot and
base/new subsampling; the example tree of tools/make_image_folder.py; and train.py and
tools/run_protocol.py on such a tree."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image

from forked_runs import run_script
from mini_datasets import cfg_for
from vlprompt.clip.templates import dataset_template
from vlprompt.config import ConfigError
from vlprompt.engine.config_checks import validate_cfg
from vlprompt.data.checks import BadImagesError
from vlprompt.data.datasets import build_dataset
from vlprompt.data.image_tree import ImageTreeError
from vlprompt_app.commands import make_image_folder, run_protocol

ROOT = Path(__file__).resolve().parents[1]
SPLIT = "split_zhou_ImageFolder.json"
SOURCE = "split_zhou_ImageFolder.source.json"


def image(path, shade=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (shade % 256, 40, 90)).save(path)


def tree(root, classes=("cat", "golden_retriever", "bird"), per_class=10):
    """ROOT/<class>/<n>.png for each class."""
    for index, name in enumerate(classes):
        for n in range(per_class):
            image(root / name / f"{n:02d}.png", index * 40 + n)
    return root


def cfg(root, **keys):
    """A config reading ``root`` as ImageFolder; ``keys``: DATASET.IMAGE_FOLDER keys by name, other
    keys dotted (``**{"DATASET.NUM_SHOTS": 2}``)."""
    config = cfg_for(root, "ImageFolder")
    for key, value in keys.items():
        names = key.split(".") if "." in key else ["DATASET", "IMAGE_FOLDER", key]
        node = config
        for name in names[:-1]:
            node = node[name]
        assert names[-1] in node, key
        node[names[-1]] = value
    return config


def written(root):
    return sorted(name for name in os.listdir(root) if name.startswith("split_"))


# ------------------------------------------------------------------------------ layouts

def test_class_folders_make_a_split_once_and_read_it_back(tmp_path):
    root = tree(tmp_path / "tree")
    image(root / "cat" / "indoor" / "nested.png")  # sub-folders belong to their class folder
    image(root / ".hidden" / "x.png")
    image(root / "cat" / ".x.png")
    (root / "cat" / ".DS_Store").write_text("hidden files are ignored")
    image(tmp_path / "elsewhere" / "fish" / "0.png")
    for n in range(1, 10):
        image(tmp_path / "elsewhere" / "fish" / f"{n}.png")
    (root / "fish").symlink_to(tmp_path / "elsewhere" / "fish", target_is_directory=True)

    first = build_dataset(cfg(root))
    assert first.classnames == ["bird", "cat", "fish", "golden retriever"]  # sorted folders, "_" read as " "
    assert (len(first.train_x), len(first.val), len(first.test)) == (21, 8, 12)  # 10 images: 5 / 2 / 3; cat (11): 6 / 2 / 3
    assert {item.impath for item in first.train_x + first.val + first.test} >= {str(root / "cat/indoor/nested.png")}
    assert written(root) == ["split_fewshot", SPLIT, SOURCE]
    split = json.loads((root / SPLIT).read_text())
    assert sorted(split) == ["test", "train", "val"]
    assert ["fish/0.png", 2, "fish"] in split["train"] + split["val"] + split["test"]
    assert json.loads((root / SOURCE).read_text())["split_ratio"] == [0.5, 0.2, 0.3]

    before = (root / SPLIT).read_bytes()
    config = cfg(root)
    config.SEED = 7  # the run's seed does not change the split
    again = build_dataset(config)
    assert (root / SPLIT).read_bytes() == before
    for part in ("train_x", "val", "test"):
        assert [(d.impath, d.label, d.classname) for d in getattr(again, part)] == \
               [(d.impath, d.label, d.classname) for d in getattr(first, part)]
    assert dataset_template(again) == "a photo of a {}."
    assert dataset_template(build_dataset(cfg(root, TEMPLATE="a sketch of a {}."))) == "a sketch of a {}."


def test_another_split_seed_makes_another_split(tmp_path):
    one = build_dataset(cfg(tree(tmp_path / "a")))
    other = build_dataset(cfg(tree(tmp_path / "b"), SPLIT_SEED=2))
    assert [Path(d.impath).name for d in one.train_x] != [Path(d.impath).name for d in other.train_x]


def test_names_file_names_and_orders_the_classes(tmp_path):
    root = tree(tmp_path / "tree")
    (root / "classnames.txt").write_text("# folder, then the class name\ngolden_retriever Golden Retriever\n"
                                         "cat house cat\n\nbird small bird\n")
    dataset = build_dataset(cfg(root))
    assert dataset.classnames == ["Golden Retriever", "house cat", "small bird"]
    assert {d.classname for d in dataset.train_x if "golden_retriever" in d.impath} == {"Golden Retriever"}


def test_csv_list_with_its_own_split_and_a_names_file(tmp_path):
    root = tmp_path / "tree"
    rows = ["path,label,split"]
    for label in ("2", "10"):
        for n in range(6):
            image(root / "img" / f"{label}_{n}.jpg")
            rows.append(f"img/{label}_{n}.jpg,{label},{('train', 'train', 'train', 'val', 'test', 'test')[n]}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    (root / "names.txt").write_text("10 ten\n2 two\n")
    dataset = build_dataset(cfg(root, CLASSNAMES_FILE="names.txt"))
    assert dataset.classnames == ["ten", "two"]  # the names file's order
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (6, 2, 4)
    assert json.loads((root / SOURCE).read_text())["split_from"] == "list"
    assert {d.classname for d in dataset.test if d.impath.endswith("img/2_5.jpg")} == {"two"}


def test_json_list_split_by_ratio_with_integer_labels_in_numeric_order(tmp_path):
    root = tmp_path / "tree"
    rows = []
    for label in (10, 2, 1):
        for n in range(4):
            image(root / f"{label}_{n}.png")
            rows.append({"path": f"{label}_{n}.png", "label": label})
    (root / "labels.json").write_text(json.dumps(rows))
    dataset = build_dataset(cfg(root))
    assert dataset.classnames == ["1", "2", "10"]
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (6, 3, 3)


def test_a_given_split_file_is_read_as_it_is(tmp_path):
    root = tree(tmp_path / "tree")
    given = {"train": [["cat/00.png", 0, "cat"], ["bird/00.png", 1, "bird"]], "val": [["cat/01.png", 0, "cat"]],
             "test": [["bird/01.png", 1, "bird"]]}
    (tmp_path / "mine.json").write_text(json.dumps(given))
    dataset = build_dataset(cfg(root, SPLIT_FILE=str(tmp_path / "mine.json")))
    assert dataset.classnames == ["cat", "bird"]  # the split's labels, not the folder order
    assert (len(dataset.train_x), len(dataset.val), len(dataset.test)) == (2, 1, 1)
    assert written(root) == ["split_fewshot"]  # nothing written beside the data


def test_fewshot_and_base_new_subsampling(tmp_path):
    root = tree(tmp_path / "tree", classes=("a", "b", "c", "d", "e"))
    base = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2, "DATASET.SUBSAMPLE_CLASSES": "base"}))
    assert base.classnames == ["a", "b", "c"] and len(base.train_x) == 6 and len(base.val) == 6
    assert (root / "split_fewshot" / "shot_2-seed_1.json").is_file()
    new = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2, "DATASET.SUBSAMPLE_CLASSES": "new"}))
    assert new.classnames == ["d", "e"] and {d.label for d in new.test} == {0, 1}


def test_the_tree_can_sit_beside_other_datasets(tmp_path):
    tree(tmp_path / "data" / "my_images")
    dataset = build_dataset(cfg(tmp_path / "data", DIR="my_images"))
    assert len(dataset.classnames) == 3 and (tmp_path / "data" / "my_images" / SPLIT).is_file()


# ------------------------------------------------------------------------------ trees that move or cannot be written

def selection(dataset, root):
    """(path relative to ``root``, label) of the few-shot train and val items."""
    return [(os.path.relpath(d.impath, root), d.label) for d in dataset.train_x + dataset.val]


def test_a_copied_or_moved_tree_keeps_its_split_and_fewshot_cache(tmp_path, capsys):
    root = tree(tmp_path / "tree")
    first = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2}))
    cache = root / "split_fewshot" / "shot_2-seed_1.json"
    assert json.loads(cache.read_text())["train"][0][0] in {"bird/" + name for name in os.listdir(root / "bird")}
    capsys.readouterr()

    copy = tmp_path / "copy_of_tree"
    shutil.copytree(root, copy)  # the original stays: its paths exist but are not the copy's split
    copied = build_dataset(cfg(copy, **{"DATASET.NUM_SHOTS": 2}))
    assert f"Loading preprocessed few-shot data from {copy / 'split_fewshot' / 'shot_2-seed_1.json'}" in \
        capsys.readouterr().out
    assert selection(copied, copy) == selection(first, root)
    assert all(d.impath.startswith(str(copy)) for d in copied.train_x + copied.val + copied.test)

    moved = tmp_path / "moved"
    root.rename(moved)
    assert selection(build_dataset(cfg(moved, **{"DATASET.NUM_SHOTS": 2})), moved) == selection(first, root)


def test_a_cache_with_absolute_paths_from_before_the_move_still_matches(tmp_path):
    """A few-shot cache written with absolute paths (an earlier version, Dassl) matches the split by
    its paths' tails wherever the tree is now."""
    root = tree(tmp_path / "tree")
    first = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2}))
    cache = root / "split_fewshot" / "shot_2-seed_1.json"
    stored = json.loads(cache.read_text())
    cache.write_text(json.dumps({name: [[f"/elsewhere/old_name/{path}", *rest] for path, *rest in items]
                                 for name, items in stored.items()}))
    moved = tmp_path / "renamed"
    root.rename(moved)
    assert selection(build_dataset(cfg(moved, **{"DATASET.NUM_SHOTS": 2})), moved) == selection(first, root)


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: nothing can be created below ``folder`` from now on (as on a read-only mount,
    which permissions cannot give when the tests run as root)."""
    import errno
    import tempfile

    folders = []

    def below(path):
        path = os.path.abspath(path)
        return any(path == folder or path.startswith(folder + os.sep) for folder in folders)

    def refuse(path):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    real_mkstemp, real_makedirs, real_mkdir, real_open = tempfile.mkstemp, os.makedirs, os.mkdir, open

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and below(dir):
            refuse(dir)
        return real_mkstemp(*args, dir=dir, **kwargs)

    def makedirs(name, *args, **kwargs):
        if below(name) and not os.path.isdir(name):
            refuse(name)
        return real_makedirs(name, *args, **kwargs)

    def mkdir(name, *args, **kwargs):
        if below(name):
            refuse(name)
        return real_mkdir(name, *args, **kwargs)

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and below(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "makedirs", makedirs)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr("builtins.open", guarded_open)
    return lambda folder: folders.append(os.path.abspath(folder))


def test_a_read_only_tree_keeps_its_generated_files_in_a_cache_folder(tmp_path, monkeypatch, read_only, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tree(tmp_path / "tree")
    read_only(root)
    dataset = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2}))
    assert written(root) == []
    (store,) = (tmp_path / "cache" / "vlprompt" / "datasets").iterdir()
    assert store.name.startswith("tree-") and len(store.name) == len("tree-") + 12
    assert sorted(os.listdir(store)) == ["split_fewshot", SPLIT, SOURCE]
    assert os.listdir(store / "split_fewshot") == ["shot_2-seed_1.json"]
    out = capsys.readouterr().out
    assert f"{root} cannot be written (a read-only folder): its generated split and few-shot files are kept in " \
           f"{store} (set DATASET.CACHE_DIR to choose another place)" in out

    again = build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 2}))
    out = capsys.readouterr().out
    assert f"Reading split from {store / SPLIT}" in out
    assert f"Loading preprocessed few-shot data from {store / 'split_fewshot' / 'shot_2-seed_1.json'}" in out
    assert selection(again, root) == selection(dataset, root)

    from vlprompt.data.feature_cache import FeatureCache  # the default feature cache goes there too

    cache = FeatureCache(cfg(root), encode=None, encoder_id="x", device="cpu", autocast=None, precision="fp32")
    assert cache.directory == str(store / "feature_cache" / "ImageFolder")


def test_dataset_cache_dir_names_where_generated_files_go(tmp_path, capsys):
    root = tree(tmp_path / "tree")
    build_dataset(cfg(root, **{"DATASET.CACHE_DIR": str(tmp_path / "mine"), "DATASET.NUM_SHOTS": 1}))
    assert written(root) == []
    (store,) = (tmp_path / "mine").iterdir()
    assert sorted(os.listdir(store)) == ["split_fewshot", SPLIT, SOURCE]
    assert f"are kept in {store} (DATASET.CACHE_DIR)" in capsys.readouterr().out


# ------------------------------------------------------------------------------ refused input

def refused(config, *patterns, error=ImageTreeError):
    """Build the dataset, expect ``error`` whose message has every pattern; return the message."""
    with pytest.raises(error) as caught:
        build_dataset(config)
    message = str(caught.value)
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_an_empty_class_folder(tmp_path):
    root = tree(tmp_path / "tree")
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("")
    refused(cfg(root, **{"DATASET.SKIP_BAD_IMAGES": True}), "1 class folder(s) hold no image", str(root / "empty"),
            "ROOT/\n  <class folder>/<image>")
    assert written(root) == []


def test_files_that_are_not_images_are_refused_or_skipped(tmp_path, capsys):
    root = tree(tmp_path / "tree")
    (root / "cat" / "notes.txt").write_text("")
    (root / "bird" / "clip.mp4").write_bytes(b"")
    refused(cfg(root), "2 file(s) of the class folders", str(root / "cat" / "notes.txt"), str(root / "bird" / "clip.mp4"),
            "DATASET.SKIP_BAD_IMAGES True")
    assert written(root) == []
    dataset = build_dataset(cfg(root, **{"DATASET.SKIP_BAD_IMAGES": True}))
    assert "Left out 2 file(s)" in capsys.readouterr().out
    assert not any(d.impath.endswith((".txt", ".mp4")) for d in dataset.train_x + dataset.val + dataset.test)


def test_image_files_that_do_not_decode_stop_before_the_split_is_written(tmp_path):
    root = tree(tmp_path / "tree")
    (root / "cat" / "broken.png").write_bytes(b"not a png")
    refused(cfg(root), "1 image file(s) used by this run cannot be read", "broken.png", error=BadImagesError)
    assert written(root) == []
    dataset = build_dataset(cfg(root, **{"DATASET.SKIP_BAD_IMAGES": True}))  # the trainer leaves it out
    assert any(d.impath.endswith("broken.png") for d in dataset.train_x + dataset.val + dataset.test)
    assert build_dataset(cfg(tree(tmp_path / "other"), **{"DATASET.CHECK_IMAGES": "off"}))


def test_two_folders_with_one_class_name(tmp_path):
    root = tree(tmp_path / "tree", classes=("Golden_Retriever", "golden retriever", "cat"))
    refused(cfg(root), 'folder "Golden_Retriever" (class name "Golden Retriever") and folder "golden retriever"',
            "CLIP's tokenizer could not tell them apart")
    assert written(root) == []


def test_a_class_with_fewer_images_than_num_shots(tmp_path):
    root = tree(tmp_path / "tree")
    message = refused(cfg(root, **{"DATASET.NUM_SHOTS": 8}), "DATASET.NUM_SHOTS is 8", '"bird": 5', '"cat": 5',
                      "in the split made from", "(train share 0.5 of each class", "no split file was written",
                      "Lower NUM_SHOTS, add images to these classes, or give the train share more in SPLIT_RATIO")
    assert "delete" not in message  # no file to delete: the split was never written
    assert written(root) == []
    build_dataset(cfg(root, **{"DATASET.NUM_SHOTS": 4}))
    refused(cfg(root, **{"DATASET.NUM_SHOTS": 16}), "DATASET.NUM_SHOTS is 16", f"in the split {root / SPLIT}",
            "delete the split file and its .source.json")  # also on a split read back, which can be deleted


def test_a_single_class_is_refused(tmp_path):
    """A classifier of one class is right on every image: refused, for folders and list files."""
    root = tree(tmp_path / "tree", classes=("cat",))
    refused(cfg(root), f'{root} holds a single class, "cat": a classifier needs at least two', "Add a folder")
    assert written(root) == []
    listed = tmp_path / "listed"
    for n in range(4):
        image(listed / f"{n}.png")
    (listed / "labels.csv").write_text("".join(f"{n}.png,cat\n" for n in range(4)))
    refused(cfg(listed), "holds a single class", "Add a folder or list label per further class")
    assert written(listed) == []


def test_a_split_file_with_entries_of_the_wrong_types(tmp_path):
    root = tree(tmp_path / "tree")
    (root / SPLIT).write_text(json.dumps({"train": [["cat/00.png", "notint", "cat"]], "val": [], "test": []}))
    refused(cfg(root), f"the split file {root / SPLIT} is not a CoOp split", "label (an integer >= 0)")


def test_a_class_too_small_for_the_ratio(tmp_path):
    root = tree(tmp_path / "tree", per_class=3)
    refused(cfg(root), "3 class(es) have too few images", "needs at least 4 images per class", '"cat" (cat): 3')
    assert written(root) == []


def test_a_list_label_that_is_not_in_the_names_file(tmp_path):
    root = tmp_path / "tree"
    for n in range(4):
        image(root / f"{n}.png")
    (root / "labels.csv").write_text("0.png,cat\n1.png,cat\n2.png,dog\n3.png,dgo\n")
    (root / "classnames.txt").write_text("cat a cat\ndog a dog\n")
    refused(cfg(root), "1 label(s) of the list file", "are not in the names file", "dgo", str(root / "labels.csv"))
    assert written(root) == []


@pytest.mark.parametrize("header", ["file,class", "Filename,Category,Subset", "class,image"])
def test_a_csv_header_with_the_usual_column_names(tmp_path, header):
    root = tmp_path / "tree"
    columns = [name.lower() for name in header.split(",")]
    rows = [header]
    for label in ("cat", "dog"):
        for n, part in enumerate(("train", "train", "val", "test")):
            image(root / f"{label}{n}.png")
            values = {"file": f"{label}{n}.png", "filename": f"{label}{n}.png", "image": f"{label}{n}.png",
                      "class": label, "category": label, "subset": part}
            rows.append(",".join(values[column] for column in columns))
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    dataset = build_dataset(cfg(root))
    assert dataset.classnames == ["cat", "dog"]
    assert sorted(os.path.basename(d.impath) for d in dataset.train_x + dataset.val + dataset.test) == \
        sorted(f"{label}{n}.png" for label in ("cat", "dog") for n in range(4))
    if "subset" in columns:  # the split column, by its other name
        assert sorted(os.path.basename(d.impath) for d in dataset.val) == ["cat2.png", "dog2.png"]


def test_a_csv_header_with_unknown_column_names(tmp_path):
    root = tmp_path / "tree"
    image(root / "0.png")
    image(root / "1.png")
    (root / "labels.csv").write_text("picture,kind\n0.png,cat\n1.png,dog\n")
    message = refused(cfg(root), "line 1 of the list file", "(picture,kind) looks like a header, but its column names "
                      "are not recognised; name the columns path (or file, filename,", "label (or class,")
    assert "is not an image" not in message and "not images" not in message
    assert written(root) == []


@pytest.mark.parametrize("rows, message", [
    ("0.png,cat\nmissing.png,cat\n", "do not exist:\n  line 2: "),
    ("0.png\n", "line 1 of the list file"),
    ("0.png,cat,train\n1.png,cat\n", "is empty in 1 row(s)"),
    ("0.png,cat,training\n", "holds 'training'"),
    ("../0.png,cat\n", "lie outside the root"),
])
def test_bad_list_rows(tmp_path, rows, message):
    root = tmp_path / "tree"
    image(root / "0.png")
    image(root / "1.png")
    (root / "labels.csv").write_text(rows)
    refused(cfg(root), message, "labels.csv | labels.json")
    assert written(root) == []


def test_a_split_file_naming_images_that_do_not_exist(tmp_path):
    root = tree(tmp_path / "tree")
    (root / SPLIT).write_text(json.dumps({"train": [["cat/00.png", 0, "cat"], ["cat/gone.png", 0, "cat"]],
                                          "val": [], "test": [["dog/1.png", 0, "cat"]]}))
    refused(cfg(root), "names 2 image(s) that do not exist", f"train: {root / 'cat/gone.png'}",
            f"test: {root / 'dog/1.png'}")


def test_a_changed_tree_under_a_made_split(tmp_path):
    root = tree(tmp_path / "tree")
    build_dataset(cfg(root))
    split = (root / SPLIT).read_bytes()
    image(root / "cat" / "new.png")
    (root / "bird" / "00.png").unlink()
    tree(root, classes=("owl",))
    message = refused(cfg(root), "is not what the split", "1 image(s) added (e.g. cat/new.png", "image(s) removed",
                      "bird/00.png", "class(es) new: owl", f"delete {root / SPLIT}, {root / SOURCE}",
                      str(root / "split_fewshot"))
    assert "The split is kept" in message and (root / SPLIT).read_bytes() == split
    (root / SPLIT).unlink()
    (root / SOURCE).unlink()
    assert "owl" in build_dataset(cfg(root)).classnames  # regenerated as the message says


def test_changed_split_settings_under_a_made_split(tmp_path):
    root = tree(tmp_path / "tree")
    build_dataset(cfg(root))
    refused(cfg(root, SPLIT_SEED=5), "the split was made with split_seed 1; now split_seed 5")


def test_no_root_and_a_missing_names_file(tmp_path):
    refused(cfg(""), "DATASET.ROOT (--root) is empty")
    refused(cfg(tmp_path / "nowhere"), "is not a folder")
    refused(cfg(tree(tmp_path / "tree"), CLASSNAMES_FILE="names.txt"), "the names file", "does not exist")


@pytest.mark.parametrize("keys, message", [
    ({"SPLIT_RATIO": (0.5, 0.5, 0.0)}, "SPLIT_RATIO must be three positive numbers"),
    ({"SPLIT_RATIO": (0.6, 0.2, 0.3)}, "that sum to 1"),
    ({"TEMPLATE": "a photo"}, "TEMPLATE must contain exactly one '{}'"),
    ({"LAYOUT": "tree"}, "LAYOUT must be one of ['auto', 'folders', 'list']"),
    ({"LAYOUT": "folders", "LIST_FILE": "labels.csv"}, 'LAYOUT is "folders" but LIST_FILE is "labels.csv"'),
])
def test_bad_options_are_config_errors(tmp_path, keys, message):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(cfg(tmp_path, **keys))
    assert message in str(caught.value)


# ------------------------------------------------------------------------------ commands

def test_make_image_folder_writes_a_tree_the_dataset_reads(tmp_path, capsys):
    out = tmp_path / "images"
    assert make_image_folder.main([str(out), "--classes", "4", "--images-per-class", "5"]) == 0
    assert sorted(os.listdir(out)) == ["blue_circle", "blue_square", "red_circle", "red_square"]
    assert all(Image.open(out / "red_circle" / f"{n:04d}.png").size == (32, 32) for n in range(5))
    dataset = build_dataset(cfg(out))
    assert dataset.classnames == ["blue circle", "blue square", "red circle", "red square"]
    assert make_image_folder.main([str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["images"]


def test_make_image_folder_refuses_a_path_below_a_file_or_unwritable(tmp_path, capsys, read_only):
    (tmp_path / "a_file").write_text("")
    assert make_image_folder.main([str(tmp_path / "a_file" / "tree")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'a_file'} is a file, so {tmp_path / 'a_file' / 'tree'} "
                                       "cannot be made below it; give a path of folders\n")
    read_only(tmp_path / "ro")
    assert make_image_folder.main([str(tmp_path / "ro" / "tree"), "--classes", "2", "--images-per-class", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: could not write {tmp_path / 'ro' / 'tree'} (Read-only file system: ") and \
        err.endswith("nothing was left behind\n")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_run_protocol_runs_over_the_tree(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["--benchmark", "synthetic", "--protocol", "base2new", "fewshot", "--datasets", "image_folder",
            "--trainers", "CoOp:synthetic", "--shots", "2", "--seeds", "1", "--root", str(tmp_path / "tree"),
            "--output", str(tmp_path / "out"), "--dry-run"]
    assert run_protocol.main(argv) == 0
    out = capsys.readouterr().out
    assert "configs/datasets/image_folder.yaml" in out and f"--root {tmp_path / 'tree'}" in out
    assert "base2new/train_base/image_folder/shots_2/CoOp/synthetic/seed1" in out
    assert "out/image_folder/CoOp/synthetic_2shots/seed1" in out


@pytest.mark.e2e
def test_train_py_runs_coop_on_a_generated_tree(tmp_path):
    tree_dir = tmp_path / "images"
    assert make_image_folder.main([str(tree_dir), "--classes", "4", "--images-per-class", "8"]) == 0

    def train(output, *extra):
        command = [sys.executable, "train.py", "--root", str(tree_dir), "--trainer", "CoOp",
                   "--dataset-config-file", "configs/datasets/image_folder.yaml",
                   "--config-file", "configs/trainers/CoOp/synthetic.yaml", "--output-dir", str(output),
                   "--seed", "1", "OPTIM.MAX_EPOCH", "2", *extra]
        return run_script(command, timeout=600)

    result = train(tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["dataset"] == "ImageFolder" and record["completed"] and record["num_classes"] == 4
    assert (tree_dir / SPLIT).is_file()

    (tree_dir / "red_circle" / "notes.txt").write_text("")
    result = train(tmp_path / "bad")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "notes.txt" in result.stderr and "are not images" in result.stderr
