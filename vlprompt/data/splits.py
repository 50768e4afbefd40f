"""CoOp's split helpers and the common dataset pipeline.

The dataset files subclass `CoopSplitDataset`, whose constructor calls
`prepare_coop_splits`, which runs the whole pipeline: split JSON (or the dataset's
own split builder) -> few-shot sampling with a cache in `<dataset_dir>/split_fewshot/`
-> base/new subsampling. `read_list_file` and `split_official_lists` are the
builders' common parts (lists of images with their category, official train/test lists).

The few-shot cache lives in :mod:`vlprompt.data.fewshot_cache` and the files of Datum lists
(Dassl's pickles, our JSON, moved paths) in :mod:`vlprompt.data.datum_files`; the names that
datasets, tools and train.py import from here (`FEWSHOT_DIRNAME`, `UnsafePickleError`,
`read_datum_pickle`, `write_datum_json`, `load_datum_cache`, `fewshot_cache_stem`,
`load_fewshot_cache`, `save_fewshot_cache`) are re-exported, so this module is the one
import path of the dataset pipeline.
"""
import json
import math
import os
import random

from vlprompt.data.checks import DatasetContentError
from vlprompt.data.datasets.base_dataset import DatasetBase, Datum, MissingImagesError
from vlprompt.data.datum_files import UnsafePickleError, missing_images_message, read_datum_pickle, write_datum_json
from vlprompt.data.fewshot_cache import (
    FEWSHOT_DIRNAME, fewshot_cache_stem, fewshot_with_cache, load_datum_cache, load_fewshot_cache, save_fewshot_cache,
)
from vlprompt.data.generated_files import generated_file, generated_files_dir
from vlprompt.utils import listdir_nohidden, mkdir_if_missing, read_json, write_json

__all__ = [
    "FEWSHOT_DIRNAME",
    "SUBSAMPLE_CHOICES",
    "CoopSplitDataset",
    "SplitFileError",
    "UnsafePickleError",
    "build_datums",
    "fewshot_cache_stem",
    "load_datum_cache",
    "load_fewshot_cache",
    "prepare_coop_splits",
    "read_and_split_data",
    "read_datum_pickle",
    "read_split",
    "save_fewshot_cache",
    "save_split",
    "split_official_lists",
    "split_trainval",
    "subsample_classes",
    "valid_split_entry",
    "write_datum_json",
]

SUBSAMPLE_CHOICES = ("all", "base", "new")


class SplitFileError(DatasetContentError, ValueError):
    """A split JSON that is not ``{"train"|"val"|"test": [[relative_path, label, classname], ...]}``."""


def valid_split_entry(entry):
    """Whether a split entry is [non-empty str, int >= 0 (not a bool), str]."""
    path, label, classname = entry
    return (isinstance(path, str) and bool(path) and isinstance(label, int) and not isinstance(label, bool)
            and label >= 0 and isinstance(classname, str))


def build_datums(records, source):
    """Create Datum objects after checking all their files at once.

    Args:
        records (iterable of (str, int, str)): (absolute image path, label, classname).
        source (str): where the records come from, for the error message.

    Returns:
        list[Datum]: with domain 0, in record order.

    Raises:
        MissingImagesError: some files do not exist (the count and the first 5 paths).
    """
    records = list(records)
    missing = [impath for impath, _, _ in records if not os.path.isfile(impath)]
    if missing:
        raise MissingImagesError(missing_images_message(missing, len(records), source))
    return [Datum.unchecked(impath, label, 0, classname) for impath, label, classname in records]


def read_split(filepath, path_prefix):
    """Read a CoOp split JSON (`split_zhou_<Name>.json`).

    Args:
        filepath (str): the JSON file, {"train"|"val"|"test": [[relative_path, label, classname], ...]}.
        path_prefix (str): folder the relative paths are relative to.

    Returns:
        (list[Datum], list[Datum], list[Datum]): train, val, test in file order.

    Raises:
        SplitFileError: the file does not have the expected structure or types.
        MissingImagesError: listed images do not exist.
    """
    print(f"Reading split from {filepath}")
    split = read_json(filepath)
    outputs = []
    for name in ("train", "val", "test"):
        entries = split.get(name) if isinstance(split, dict) else None
        if not isinstance(entries, list) or any(
            not isinstance(entry, list) or len(entry) != 3 for entry in entries
        ):
            raise SplitFileError(
                f'Split file {filepath} has no valid "{name}" list: expected a JSON object with keys '
                '"train", "val" and "test", each a list of [relative_path, label, classname].'
            )
        wrong = [(index, entry) for index, entry in enumerate(entries) if not valid_split_entry(entry)]
        if wrong:
            shown = "; ".join(f"{name}[{index}] = {json.dumps(entry)}" for index, entry in wrong[:3])
            raise SplitFileError(
                f'Split file {filepath}: {len(wrong)} entr{"y" if len(wrong) == 1 else "ies"} of its "{name}" list '
                f"have the wrong types ({shown}); each entry is [relative_path (a string), label (an integer >= 0), "
                "classname (a string)]. Fix the file, or delete it to have the split made again."
            )
        records = [(os.path.join(path_prefix, rel), label, cname) for rel, label, cname in entries]
        outputs.append(build_datums(records, f'the "{name}" list of {filepath}'))
    return tuple(outputs)


def save_split(train, val, test, filepath, path_prefix):
    """Write a CoOp split JSON with paths relative to `path_prefix` (forward slashes, no leading slash)."""

    def _entries(items):
        entries = []
        for item in items:
            relative = item.impath.replace(path_prefix, "")
            if relative.startswith(os.sep):
                relative = relative[1:]
            entries.append([relative.replace(os.sep, "/"), item.label, item.classname])
        return entries

    write_json({"train": _entries(train), "val": _entries(val), "test": _entries(test)}, filepath)
    print(f"Saved split to {filepath}")


def split_trainval(trainval, p_val=0.2):
    """Split each class of `trainval` into train and val with Python's `random` (CoOp's rule).

    Per class (first-appearance order): n_val = round(n * p_val), the index list is
    shuffled, the first n_val go to val and the rest to train.

    Returns:
        (list[Datum], list[Datum]): train, val.

    Raises:
        ValueError: a class is too small to give at least one validation item.
    """
    p_trn = 1 - p_val
    print(f"Splitting trainval into {p_trn:.0%} train and {p_val:.0%} val")
    indices_by_label = {}
    for index, item in enumerate(trainval):
        indices_by_label.setdefault(item.label, []).append(index)

    train, val = [], []
    for label, indices in indices_by_label.items():
        n_val = round(len(indices) * p_val)
        if n_val <= 0:
            raise ValueError(
                f"Cannot split trainval: class {label} has {len(indices)} item(s), so "
                f"round({len(indices)} * {p_val}) = 0 validation items; every class needs enough "
                "items for at least one."
            )
        random.shuffle(indices)
        for position, index in enumerate(indices):
            (val if position < n_val else train).append(trainval[index])
    return train, val


def split_official_lists(read_list, trainval_list, test_list):
    """CoOp's split of a dataset with official trainval and test lists.

    Args:
        read_list (callable): list -> list[Datum] (reads one official list).
        trainval_list, test_list: what `read_list` takes for each list (e.g. a file name).

    Returns:
        (list[Datum], list[Datum], list[Datum]): train and val (`split_trainval` of the
        trainval list, 80 % / 20 % per class), test (the test list).
    """
    trainval = read_list(trainval_list)
    test = read_list(test_list)
    train, val = split_trainval(trainval)
    return train, val, test


def read_and_split_data(image_dir, p_trn=0.5, p_val=0.2, ignored=(), new_cnames=None):
    """Build train/val/test from class folders (CoOp's generic folder split).

    Categories are the non-hidden entries of `image_dir` minus `ignored`, sorted
    (plain string sort); label = position. Per category, the file names in
    directory-listing order are shuffled with Python's `random`; the first
    round(n * p_trn) go to train, the next round(n * p_val) to val, the rest to test.

    Args:
        image_dir (str): folder of class folders.
        p_trn, p_val (float): train and val fractions.
        ignored (sequence[str]): category folders to skip.
        new_cnames (dict[str, str] | None): folder name -> class name, for the folders it lists.

    Returns:
        (list[Datum], list[Datum], list[Datum]): train, val, test.

    Raises:
        ValueError: a category is too small to give each part at least one image.
    """
    categories = sorted(c for c in listdir_nohidden(image_dir) if c not in ignored)
    p_tst = 1 - p_trn - p_val
    print(f"Splitting into {p_trn:.0%} train, {p_val:.0%} val, and {p_tst:.0%} test")

    train, val, test = [], [], []
    for label, category in enumerate(categories):
        category_dir = os.path.join(image_dir, category)
        images = [os.path.join(category_dir, name) for name in listdir_nohidden(category_dir)]
        random.shuffle(images)
        n_total = len(images)
        n_train = round(n_total * p_trn)
        n_val = round(n_total * p_val)
        n_test = n_total - n_train - n_val
        if n_train <= 0 or n_val <= 0 or n_test <= 0:
            raise ValueError(
                f'Cannot split category "{category}" of {image_dir}: {n_total} image(s) give '
                f"{n_train} train / {n_val} val / {n_test} test; each part needs at least one image."
            )
        classname = new_cnames[category] if new_cnames is not None and category in new_cnames else category

        def _collate(paths):
            return [Datum(impath=path, label=label, classname=classname) for path in paths]

        train.extend(_collate(images[:n_train]))
        val.extend(_collate(images[n_train : n_train + n_val]))
        test.extend(_collate(images[n_train + n_val :]))
    return train, val, test


def subsample_classes(*datasets, subsample="all"):
    """Keep the base (first half) or new (second half) classes and relabel them from 0.

    The classes are the sorted labels of the first list; base = the first
    ceil(n / 2), new = the rest. Every list is filtered to the selected labels,
    keeping item order; kept items are re-created with the new label and domain 0.

    Args:
        *datasets (list[Datum]): train first, then e.g. val and test.
        subsample (str): "all", "base" or "new".

    Returns:
        The inputs unchanged (a tuple) for "all", else a list of filtered lists.

    Raises:
        ValueError: `subsample` is not one of "all", "base", "new".
    """
    if subsample not in SUBSAMPLE_CHOICES:
        raise ValueError(
            f'DATASET.SUBSAMPLE_CLASSES must be one of {list(SUBSAMPLE_CHOICES)}, got "{subsample}".'
        )
    if subsample == "all":
        return datasets

    labels = sorted({item.label for item in datasets[0]})
    n_base = math.ceil(len(labels) / 2)
    print(f"SUBSAMPLE {subsample.upper()} CLASSES!")
    selected = labels[:n_base] if subsample == "base" else labels[n_base:]
    relabeler = {old: new for new, old in enumerate(selected)}

    return [
        [
            Datum.unchecked(item.impath, relabeler[item.label], 0, item.classname)
            for item in dataset
            if item.label in relabeler
        ]
        for dataset in datasets
    ]




def prepare_coop_splits(cfg, dataset_dir, build_split, split_path=None, path_prefix=None, store=None):
    """The CoOp-family dataset pipeline (its four steps below).

    Generated files go to `store`: the dataset folder unless it cannot be written or
    DATASET.CACHE_DIR says otherwise (:mod:`vlprompt.data.generated_files`; found here when None).

    1. Create `<store>/split_fewshot/` (at every construction, as CoOp does).
    2. If `split_path` (or its copy in `store`) is a file: `read_split(..., path_prefix)`;
       otherwise `build_split()` and, if `split_path` is given, `save_split` to it (in `store`).
    3. If DATASET.NUM_SHOTS K >= 1: train (K per class) and val (min(K, 4)) from
       the cache `split_fewshot/shot_K-seed_SEED.*` (of the dataset folder, else of `store`), or
       sampled and cached in `store`. K of 0 or -1 (Dassl's default) uses all training images.
    4. `subsample_classes(train, val, test, subsample=DATASET.SUBSAMPLE_CLASSES)`.
    (Step 5, `DatasetBase.__init__(train_x=train, val=val, test=test)`, is the caller's.)

    A dataset without a validation split (ImageNet) returns val None from
    `build_split`: then only train is sampled and cached, subsampling applies to
    (train, test), and val stays None (the dataset then uses test as val).

    Args:
        cfg (CfgNode): reads DATASET.NUM_SHOTS, DATASET.SUBSAMPLE_CLASSES, SEED.
        dataset_dir (str): absolute dataset folder (holds split_fewshot/).
        build_split (callable): () -> (train, val | None, test), lists of Datum.
        split_path (str | None): the split JSON; None for datasets without one.
        path_prefix (str | None): folder the JSON's relative paths refer to.
        store (str | None): the folder of generated files (None: `generated_files_dir`).

    Returns:
        (list[Datum], list[Datum] | None, list[Datum]): train, val, test.
    """
    store = store or generated_files_dir(cfg, dataset_dir)
    mkdir_if_missing(os.path.join(store, FEWSHOT_DIRNAME))
    split_path = None if split_path is None else generated_file(split_path, dataset_dir, store)
    if split_path is not None and os.path.isfile(split_path):
        train, val, test = read_split(split_path, path_prefix)
    else:
        train, val, test = build_split()
        if split_path is not None:
            save_split(train, val, test, split_path, path_prefix)

    num_shots = cfg.DATASET.NUM_SHOTS
    if num_shots >= 1:
        train, val = fewshot_with_cache(dataset_dir, num_shots, cfg.SEED, train, val, store)
    else:
        print(f"DATASET.NUM_SHOTS is {num_shots}: all {len(train)} training images are used (no few-shot sampling)")

    subsample = cfg.DATASET.SUBSAMPLE_CLASSES
    if val is None:
        train, test = subsample_classes(train, test, subsample=subsample)
    else:
        train, val, test = subsample_classes(train, val, test, subsample=subsample)
    return train, val, test


# ---------------------------------------------------------------- CoOp-layout datasets

class CoopSplitDataset(DatasetBase):
    """A dataset in CoOp's layout: images under `image_folder`, the split JSON `split_file`.

    The constructor finds the dataset folder (`find_dataset_dir`), then runs
    `prepare_coop_splits`: the split JSON is read, or built by `build_split()` and saved
    when it is missing (built at every construction when `split_file` is None); few-shot
    sampling and base/new subsampling follow.

    Class attributes (besides DatasetBase's):
        image_folder (str): folder of the images inside the dataset folder; the split
            JSON's paths are relative to it ("" for paths relative to the dataset folder).

    Instance attributes: dataset_dir, image_dir, split_path (absolute paths; split_path None
    without a split file).
    """

    image_folder = ""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, self.image_folder) if self.image_folder else self.dataset_dir
        self.split_path = os.path.join(self.dataset_dir, self.split_file) if self.split_file else None
        train, val, test = prepare_coop_splits(cfg, self.dataset_dir, self.build_split, self.split_path, self.image_dir)
        super().__init__(train_x=train, val=val, test=test)

    def build_split(self):
        """(train, val, test) lists of Datum built from the dataset's own files (no split JSON yet)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_split().")

    def read_list_file(self, list_file, parse_line, cname2lab, what, names_file, line_format):
        """Read a list of images, one per line, each with its category.

        Args:
            list_file (str): the list, relative to the dataset folder.
            parse_line (callable): line -> (category, image path, class name), or None for
                a line without an image (blank); a ValueError marks a malformed line.
            cname2lab (dict[str, int]): category -> label.
            what (str): what a category is ("category", "action", ...), for the error message.
            names_file (str): the file that lists the categories (relative), for the error message.
            line_format (str): what a line looks like (e.g. "ACTION/VIDEO.avi [LABEL]"), for the
                error message of a malformed line.

        Returns:
            list[Datum]: in line order.

        Raises:
            DatasetLayoutError: a line is malformed, or its category is not in `cname2lab`
                (file and line named).
            MissingImagesError: listed images do not exist.
        """
        filepath = os.path.join(self.dataset_dir, list_file)
        records = []
        with open(filepath) as f:
            for number, line in enumerate(f, start=1):
                try:
                    entry = parse_line(line)
                except ValueError as error:
                    raise self.layout_error(
                        f'{filepath}, line {number}: "{line.strip()}" is not a line "{line_format}" ({error})'
                    ) from None
                if entry is None:
                    continue
                category, impath, classname = entry
                if category not in cname2lab:
                    raise self.layout_error(
                        f'{filepath}, line {number}: the {what} "{category}" is not listed in '
                        f"{os.path.join(self.dataset_dir, names_file)}"
                    )
                records.append((impath, cname2lab[category], classname))
        return build_datums(records, filepath)
