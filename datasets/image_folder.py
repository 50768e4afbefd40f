"""Your own images (ImageFolder): a class-per-folder tree or a list file, under --root.

    python tools/make_image_folder.py output/my_images       # an example tree, offline
    python train.py --root output/my_images --trainer CoOp \\
        --dataset-config-file configs/datasets/image_folder.yaml \\
        --config-file configs/trainers/CoOp/synthetic.yaml --output-dir output/my_images/runs/coop

The tree (ROOT below) is DATASET.ROOT itself, not a folder of datasets, unless DIR says otherwise.
The node DATASET.IMAGE_FOLDER (file names relative to the tree unless absolute):

* DIR: ``""`` (the tree is DATASET.ROOT), or the tree's folder under DATASET.ROOT, so that it can
  sit beside benchmark datasets in one ``--root`` (the transfer protocols of
  tools/run_protocol.py: ``--opts DATASET.IMAGE_FOLDER.DIR my_images``).
* LAYOUT ``auto`` | ``folders`` | ``list``: ``folders`` reads ``ROOT/<class folder>/**/<image>``
  (class order = sorted folder names, underscores in a folder name read as spaces); ``list``
  reads LIST_FILE; ``auto`` is ``list`` when LIST_FILE is set or ROOT holds ``labels.csv`` or
  ``labels.json``, else ``folders``. The readers and their file formats:
  :mod:`vlprompt.data.image_tree`.
* LIST_FILE: a CSV (``path,label[,split]``) or JSON list of the images.
* CLASSNAMES_FILE: lines ``KEY class name`` (KEY a folder name or list label); ``""`` reads
  ``ROOT/classnames.txt`` when it exists. Its line order is then the label order.
* SPLIT_FILE (default ``split_zhou_ImageFolder.json``): a CoOp split JSON
  ``{"train"|"val"|"test": [[path relative to the tree, label, class name], ...]}``, read when it
  exists. Otherwise the split is made once and written there (atomically) with
  ``<name>.source.json`` beside it, recording how it was made: from a list file's split column,
  or per class from SPLIT_RATIO (train, val, test shares; default CoOp's 0.5 / 0.2 / 0.3) with
  images shuffled by ``random.Random(SPLIT_SEED)``, independent of the run's SEED. Every later
  run, and any CoOp-family code given the same file, reads the same split.
* TEMPLATE: the class sentence (default ``"a photo of a {}."``), read by every trainer
  through ``ClipTrainer.dataset_template``.

Few-shot sampling (cached in ``<tree>/split_fewshot/``, image paths relative to the tree),
base/new subsampling and everything after them are the CoOp pipeline of
:func:`vlprompt.data.splits.prepare_coop_splits`, as for the benchmark datasets. ``split_fewshot``
and ``feature_cache`` (the default feature cache) are therefore never class folders. A tree that
cannot be written (a read-only mount) keeps its generated split, ``.source.json`` and few-shot
caches in a folder keyed by the tree (``~/.cache/vlprompt/datasets/<tree>-<hash>``, or below
DATASET.CACHE_DIR; :mod:`vlprompt.data.generated_files`), named in the log.

Bad input stops before anything is written, with one ImageTreeError (a DatasetLayoutError:
train.py prints it and exits with status 2) naming the files: no class folder, a single class
(a classifier needs two), an empty class folder, files that are not images (refused, or left
out with DATASET.SKIP_BAD_IMAGES), image files that do not decode (DATASET.CHECK_IMAGES, before
a split is written; BadImagesError), two folders whose names normalise to one class name, a list
label that is not in the names file, a class with fewer training images than DATASET.NUM_SHOTS,
a split file naming images that do not exist or holding entries of the wrong types, and a tree
(or list, or split setting) that changed since the split was made.
"""
import os
import random
from collections import Counter

from vlprompt.clip.templates import DEFAULT_TEMPLATE
from vlprompt.data.checks import check_images
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from vlprompt.data.datasets.base_dataset import dataset_root
from vlprompt.data.generated_files import generated_file, generated_files_dir
from vlprompt.data.image_tree import (
    SPLIT_NAMES, ImageTreeError, read_class_folders, read_list_file, read_names_file,
)
from vlprompt.data.splits import FEWSHOT_DIRNAME, prepare_coop_splits, read_split, save_split, valid_split_entry
from vlprompt.utils import read_json, write_json

DEFAULT_LIST_FILES = ("labels.csv", "labels.json")
DEFAULT_NAMES_FILE = "classnames.txt"
SOURCE_SUFFIX = ".source.json"
_SHOWN = 10

LAYOUTS = {
    "folders": """\
ROOT/
  <class folder>/<image>.jpg|.png|...   (one folder per class; sub-folders allowed)
  classnames.txt                        (optional: lines "FOLDER class name")
  split_zhou_ImageFolder.json           (optional: written on first use)""",
    "list": """\
ROOT/
  labels.csv | labels.json              (rows path,label[,split]; paths relative to ROOT)
  <the listed images>
  classnames.txt                        (optional: lines "LABEL class name")
  split_zhou_ImageFolder.json           (optional: written on first use)""",
}


def _under(root, name):
    """``name`` ("~" expanded) if absolute, else joined to ``root``."""
    name = os.path.expanduser(name)
    return name if os.path.isabs(name) else os.path.join(root, name)


def source_path(split_path):
    """The file that records how the split at ``split_path`` was made: ``<name>.source.json``."""
    stem = split_path.removesuffix(".json")
    return stem + SOURCE_SUFFIX


def _listing(lines):
    shown = [f"  {line}" for line in lines[:_SHOWN]]
    if len(lines) > _SHOWN:
        shown.append(f"  ... and {len(lines) - _SHOWN} more")
    return "\n".join(shown)


def _smallest_class_size(ratio):
    """The fewest images a class needs so that round(n * share) gives every part at least one."""
    n = 3
    while round(n * ratio[0]) < 1 or round(n * ratio[1]) < 1 or n - round(n * ratio[0]) - round(n * ratio[1]) < 1:
        n += 1
    return n


def split_by_ratio(tree, ratio, seed):
    """Split each class of ``tree`` into train / val / test by ``ratio`` (the module docstring's rule).

    Per class (images in path order): shuffled with ``random.Random(seed)`` (one generator, classes
    in label order); the first round(n * train share) go to train, the next round(n * val share)
    to val, the rest to test.

    Returns:
        dict[str, list[TreeImage]]: "train", "val", "test".

    Raises:
        ImageTreeError: some classes are too small to give each part at least one image.
    """
    rng = random.Random(seed)
    by_label = {label: [] for label in range(len(tree.classnames))}
    for image in tree.images:
        by_label[image.label].append(image)
    parts = {name: [] for name in SPLIT_NAMES}
    too_small = []
    for label, images in by_label.items():
        rng.shuffle(images)
        n_train, n_val = round(len(images) * ratio[0]), round(len(images) * ratio[1])
        if min(n_train, n_val, len(images) - n_train - n_val) < 1:
            too_small.append(f'"{tree.classnames[label]}" ({tree.keys[label]}): {len(images)} image(s)')
        parts["train"] += images[:n_train]
        parts["val"] += images[n_train:n_train + n_val]
        parts["test"] += images[n_train + n_val:]
    if too_small:
        raise ImageTreeError(
            f"{len(too_small)} class(es) have too few images to split by DATASET.IMAGE_FOLDER.SPLIT_RATIO "
            f"{tuple(ratio)} (train, val, test), which needs at least {_smallest_class_size(ratio)} images per "
            f"class for one in each part:\n{_listing(too_small)}\nAdd images, or change SPLIT_RATIO."
        )
    return parts


def split_from_list(tree):
    """The split a list file's split column gives (dict[str, list[TreeImage]]).

    Raises:
        ImageTreeError: a class has no training image.
    """
    parts = {name: [image for image in tree.images if image.split == name] for name in SPLIT_NAMES}
    trained = {image.label for image in parts["train"]}
    untrained = [f'"{name}" ({tree.keys[label]})' for label, name in enumerate(tree.classnames) if label not in trained]
    if untrained:
        raise ImageTreeError(
            f"{len(untrained)} class(es) of the list file {tree.source} have no row with split train (every class "
            f"needs a training image):\n{_listing(untrained)}"
        )
    return parts


def _split_entries(path):
    """{split name: [[path, label, class name], ...]} of a split JSON, its structure checked."""
    split = read_json(path)
    valid = isinstance(split, dict) and all(
        isinstance(split.get(name), list)
        and all(isinstance(entry, list) and len(entry) == 3 and valid_split_entry(entry) for entry in split[name])
        for name in SPLIT_NAMES
    )
    if not valid:
        raise ImageTreeError(
            f'the split file {path} is not a CoOp split: expected a JSON object with the keys "train", "val" '
            'and "test", each a list of [path relative to the tree (a string), label (an integer >= 0), class '
            "name (a string)]"
        )
    return split


@DATASET_REGISTRY.register()
class ImageFolder(DatasetBase):
    """The user's own images under DATASET.ROOT (module docstring); class names from the folders,
    a list file or a names file; the split from a split file, a list file or SPLIT_RATIO.

    Instance attributes: dataset_dir and image_dir (the tree, absolute), store (the folder of its
    generated files: the tree unless it cannot be written), split_path (read there or in store),
    template (DATASET.IMAGE_FOLDER.TEMPLATE), layout_kind ("folders" or "list").
    """

    dataset_dir = ""  # DATASET.ROOT itself (DATASET.IMAGE_FOLDER.DIR may name a folder under it)
    template = DEFAULT_TEMPLATE
    layout = f"{LAYOUTS['folders']}\nor\n{LAYOUTS['list']}"

    def __init__(self, cfg):
        node = cfg.DATASET.IMAGE_FOLDER
        root = _under(dataset_root(cfg), node.DIR) if node.DIR else dataset_root(cfg)
        self.layout_kind = "list" if node.LAYOUT == "list" or node.LIST_FILE else "folders"
        if not cfg.DATASET.ROOT:
            raise self.error("DATASET.ROOT (--root) is empty; set it to the folder of your images")
        if not os.path.isdir(root):
            where = f"DATASET.IMAGE_FOLDER.DIR {node.DIR} under " if node.DIR else ""
            raise self.error(f'{root} ({where}DATASET.ROOT "{cfg.DATASET.ROOT}") is not a folder; set --root to the '
                             "folder of your images")
        self.dataset_dir = self.image_dir = root
        self.template = node.TEMPLATE
        try:
            tree = self.read_tree(cfg)
            self.store = generated_files_dir(cfg, root)
            self.split_path = generated_file(_under(root, node.SPLIT_FILE), root, self.store)
            parts = self.read_or_make_split(cfg, tree)
        except ImageTreeError as error:
            raise self.error(str(error)) from None
        train, val, test = prepare_coop_splits(cfg, root, lambda: parts, store=self.store)
        super().__init__(train_x=train, val=val, test=test)

    def error(self, problem):
        """An ImageTreeError: the dataset, the tree, ``problem``, then the expected layout."""
        return ImageTreeError(
            f"Dataset ImageFolder ({self.dataset_dir or 'no folder yet'}): {problem}.\n"
            f"Expected layout ({self.layout_kind}; DATASETS.md, section 'Your own images'):\n"
            f"{LAYOUTS[self.layout_kind]}"
        )

    def _list_file(self, node):
        """The list file to read, or None for the folders layout (LAYOUT and the files present decide)."""
        if node.LAYOUT == "folders":
            return None
        if node.LIST_FILE:
            return _under(self.dataset_dir, node.LIST_FILE)
        found = [os.path.join(self.dataset_dir, name) for name in DEFAULT_LIST_FILES
                 if os.path.isfile(os.path.join(self.dataset_dir, name))]
        if len(found) > 1:
            raise ImageTreeError(f"the root holds both {' and '.join(found)}; set DATASET.IMAGE_FOLDER.LIST_FILE "
                                 "to the one to read")
        if node.LAYOUT == "list" and not found:
            raise ImageTreeError(f"DATASET.IMAGE_FOLDER.LAYOUT is list, but LIST_FILE is empty and the root holds "
                                 f"neither {' nor '.join(DEFAULT_LIST_FILES)}")
        return found[0] if found else None

    def read_tree(self, cfg):
        """The ImageTree of the tree (vlprompt.data.image_tree), by layout; sets layout_kind."""
        node = cfg.DATASET.IMAGE_FOLDER
        list_path = self._list_file(node)
        self.layout_kind = "folders" if list_path is None else "list"
        names_path = _under(self.dataset_dir, node.CLASSNAMES_FILE or DEFAULT_NAMES_FILE)
        names = read_names_file(names_path) if node.CLASSNAMES_FILE or os.path.isfile(names_path) else None
        skip = cfg.DATASET.SKIP_BAD_IMAGES
        if list_path is None:
            tree = read_class_folders(self.dataset_dir, names, names_path, skip_others=skip)
        else:
            tree = read_list_file(self.dataset_dir, list_path, names, names_path, skip_others=skip)
        named = f", names from {names_path}" if names is not None else ""
        print(f"ImageFolder: {len(tree.images)} images of {len(tree.classnames)} classes from {tree.source}{named}")
        if len(tree.classnames) < 2:
            keys = f' ({tree.keys[0]})' if tree.keys and tree.keys[0] != tree.classnames[0] else ""
            raise ImageTreeError(
                f'{tree.source} holds a single class, "{tree.classnames[0]}"{keys}: a classifier needs at least two '
                f"(with one, every prediction is right). Add a folder{' or list label' if list_path else ''} per "
                "further class"
            )
        return tree

    def source_record(self, cfg, tree):
        """What ``<split>.source.json`` records: how the split of ``tree`` is made under ``cfg``."""
        node = cfg.DATASET.IMAGE_FOLDER
        from_list = any(image.split for image in tree.images)
        return {
            "made_by": "vlprompt ImageFolder",
            "layout": self.layout_kind,
            "source": os.path.relpath(tree.source, self.dataset_dir).replace(os.sep, "/"),
            "split_from": "list" if from_list else "ratio",
            "split_ratio": None if from_list else [float(share) for share in node.SPLIT_RATIO],
            "split_seed": None if from_list else node.SPLIT_SEED,
        }

    def read_or_make_split(self, cfg, tree):
        """(train, val, test) lists of Datum: the split file's, or a split made and written now."""
        record = self.source_record(cfg, tree)
        if os.path.isfile(self.split_path):
            recorded = source_path(self.split_path)
            if os.path.isfile(recorded):
                self.check_unchanged(tree, record, read_json(recorded))
            else:
                self.check_split_images()
            train, val, test = read_split(self.split_path, self.dataset_dir)
            self.check_shots(cfg, train, made_now=False)
            return train, val, test
        parts = split_from_list(tree) if record["split_from"] == "list" else split_by_ratio(
            tree, cfg.DATASET.IMAGE_FOLDER.SPLIT_RATIO, cfg.DATASET.IMAGE_FOLDER.SPLIT_SEED)
        datums = {
            name: [Datum.unchecked(os.path.join(self.dataset_dir, *image.path.split("/")), image.label, 0,
                                   tree.classnames[image.label]) for image in images]
            for name, images in parts.items()
        }
        self.check_shots(cfg, datums["train"], made_now=True)
        if not cfg.DATASET.SKIP_BAD_IMAGES:
            check_images(datums, cfg.DATASET.CHECK_IMAGES)
        write_json(record, source_path(self.split_path))
        save_split(datums["train"], datums["val"], datums["test"], self.split_path, self.dataset_dir)
        return datums["train"], datums["val"], datums["test"]

    def check_split_images(self):
        """ImageTreeError unless every image of the split file exists in the tree."""
        split = _split_entries(self.split_path)
        missing = [f"{name}: {os.path.join(self.dataset_dir, entry[0])}" for name in SPLIT_NAMES
                   for entry in split[name] if not os.path.isfile(os.path.join(self.dataset_dir, entry[0]))]
        if missing:
            raise ImageTreeError(
                f"the split file {self.split_path} names {len(missing)} image(s) that do not exist (its paths are "
                f"relative to the tree):\n{_listing(missing)}\nRestore them, fix the split file, or point "
                "DATASET.IMAGE_FOLDER.SPLIT_FILE to a file that does not exist yet to make a new split there"
            )

    def check_unchanged(self, tree, record, recorded):
        """ImageTreeError unless the tree and the split settings are those the split was made from."""
        split = _split_entries(self.split_path)
        listed = {entry[0]: (entry[2], name) for name in SPLIT_NAMES for entry in split[name]}
        found = {image.path: (tree.classnames[image.label], image.split) for image in tree.images}
        changes = []
        settings = [key for key in ("layout", "source", "split_from", "split_ratio", "split_seed")
                    if recorded.get(key) != record[key]]
        if settings:
            changes.append("the split was made with " + ", ".join(f"{key} {recorded.get(key)}" for key in settings)
                           + "; now " + ", ".join(f"{key} {record[key]}" for key in settings))
        added = sorted(set(found) - set(listed))
        removed = sorted(set(listed) - set(found))
        relabelled = sorted(path for path in set(found) & set(listed) if found[path][0] != listed[path][0])
        moved = sorted(path for path in set(found) & set(listed)
                       if found[path][1] is not None and found[path][1] != listed[path][1])
        for count, what, paths in ((len(added), "added", added), (len(removed), "removed", removed),
                                   (len(relabelled), "with another class", relabelled),
                                   (len(moved), "in another split of the list file", moved)):
            if count:
                changes.append(f"{count} image(s) {what} (e.g. {', '.join(paths[:3])})")
        classes_now, classes_then = set(tree.classnames), {cname for cname, _ in listed.values()}
        for what, names in (("new", classes_now - classes_then), ("gone", classes_then - classes_now)):
            if names:
                changes.append(f"class(es) {what}: {', '.join(sorted(names)[:_SHOWN])}")
        if changes:
            caches = " and ".join(dict.fromkeys(os.path.join(folder, FEWSHOT_DIRNAME)
                                                for folder in (self.dataset_dir, self.store)))
            raise ImageTreeError(
                f"{tree.source} is not what the split {self.split_path} was made from: " + "; ".join(changes)
                + f". The split is kept, so that runs stay comparable. To make a new split from the images as they "
                f"are now, delete {self.split_path}, {source_path(self.split_path)} and the few-shot caches in "
                f"{caches} (sampled from the old split), then run again"
            )

    def check_shots(self, cfg, train, made_now):
        """ImageTreeError if a class has fewer training images than DATASET.NUM_SHOTS (when >= 1).

        ``made_now``: the split was just made from the tree (and is not written: the advice is then
        about the tree and SPLIT_RATIO), else it was read from ``split_path``.
        """
        shots = cfg.DATASET.NUM_SHOTS
        if shots < 1:
            return
        counts = Counter(item.label for item in train)
        names = {item.label: item.classname for item in train}
        short = [f'"{names[label]}": {count}' for label, count in sorted(counts.items()) if count < shots]
        if not short:
            return
        if made_now:
            ratio = tuple(cfg.DATASET.IMAGE_FOLDER.SPLIT_RATIO)
            where = (f"the split made from {self.dataset_dir} (train share {ratio[0]:g} of each class, "
                     "DATASET.IMAGE_FOLDER.SPLIT_RATIO; no split file was written)")
            advice = "Lower NUM_SHOTS, add images to these classes, or give the train share more in SPLIT_RATIO"
        else:
            where = f"the split {self.split_path}"
            advice = ("Lower NUM_SHOTS, or add images and make a new split (delete the split file and its "
                      ".source.json; a larger train share in SPLIT_RATIO also helps)")
        raise ImageTreeError(
            f"DATASET.NUM_SHOTS is {shots}, but {len(short)} class(es) have fewer training images in {where}:\n"
            f"{_listing(short)}\n{advice}"
        )
