"""CoOp's split helpers, the few-shot cache and the common dataset pipeline (engine.md §4.4–4.5).

The dataset files subclass `CoopSplitDataset`, whose constructor calls
`prepare_coop_splits`, which runs the whole pipeline: split JSON (or the dataset's
own split builder) -> few-shot sampling with a cache in `<dataset_dir>/split_fewshot/`
-> base/new subsampling. `read_list_file` and `split_official_lists` are the
builders' common parts (lists of images with their category, official train/test lists).

Few-shot caches: Dassl writes `shot_{K}-seed_{SEED}.pkl` (a pickle of Datum
objects); we read those with a restricted unpickler and write our own as
`shot_{K}-seed_{SEED}.json`. Both hold absolute image paths; paths that moved
with the dataset folder are rewritten on load.
"""
import builtins
import json
import math
import os
import pickle
import random
import warnings

from vlprompt.data.checks import DatasetContentError
from vlprompt.data.datasets.base_dataset import (
    DATASETS_DOC, DatasetBase, Datum, MissingImagesError, generate_fewshot_dataset,
)
from vlprompt.utils import atomic_write, listdir_nohidden, mkdir_if_missing, read_json, write_json

SUBSAMPLE_CHOICES = ("all", "base", "new")
FEWSHOT_DIRNAME = "split_fewshot"
_MAX_LISTED_PATHS = 5


def _missing_images_message(missing, total, source):
    shown = "\n".join(f"  {path}" for path in missing[:_MAX_LISTED_PATHS])
    return (
        f"{len(missing)} of {total} images listed in {source} do not exist (an incomplete download, "
        f"or DATASET.ROOT pointing at another copy? {DATASETS_DOC} gives each dataset's layout). "
        f"First {min(len(missing), _MAX_LISTED_PATHS)}:\n{shown}"
    )


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
        raise MissingImagesError(_missing_images_message(missing, len(records), source))
    return [Datum.unchecked(impath, label, 0, classname) for impath, label, classname in records]


def read_split(filepath, path_prefix):
    """Read a CoOp split JSON (`split_zhou_<Name>.json`).

    Args:
        filepath (str): the JSON file, {"train"|"val"|"test": [[relative_path, label, classname], ...]}.
        path_prefix (str): folder the relative paths are relative to.

    Returns:
        (list[Datum], list[Datum], list[Datum]): train, val, test in file order.

    Raises:
        ValueError: the file does not have the expected structure.
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
            raise ValueError(
                f'Split file {filepath} has no valid "{name}" list: expected a JSON object with keys '
                '"train", "val" and "test", each a list of [relative_path, label, classname].'
            )
        records = [(os.path.join(path_prefix, rel), int(label), cname) for rel, label, cname in entries]
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


# ---------------------------------------------------------------- pickles of Datum

_DATUM_GLOBALS = {
    ("dassl.data.datasets.base_dataset", "Datum"),
    ("vlprompt.data.datasets.base_dataset", "Datum"),
}
_CONTAINER_BUILTINS = {"dict", "list", "tuple", "set", "frozenset"}


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle of Datum lists references something other than Datum and builtin containers."""


class _DatumUnpickler(pickle.Unpickler):
    """Unpickler that resolves only Datum (Dassl's or ours) and builtin containers.

    Datum objects are rebuilt from their pickled instance dict (their constructor
    does not run); any other global is refused before it can be called.
    """

    def find_class(self, module, name):
        if (module, name) in _DATUM_GLOBALS:
            return Datum
        if module == "builtins" and name in _CONTAINER_BUILTINS:
            return getattr(builtins, name)
        raise UnsafePickleError(f"{module}.{name}")


def _check_datum_lists(data, path):
    """Validate {split name: [Datum, ...]} loaded from `path`."""
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a dict of lists of Datum, got {type(data).__name__}.")
    for name, items in data.items():
        if not isinstance(items, list):
            raise ValueError(f'{path}: entry "{name}" should be a list of Datum, got {type(items).__name__}.')
        for item in items:
            valid = (
                isinstance(item, Datum)
                and isinstance(getattr(item, "_impath", None), str)
                and isinstance(getattr(item, "_label", None), int)
                and isinstance(getattr(item, "_domain", None), int)
                and isinstance(getattr(item, "_classname", None), str)
            )
            if not valid:
                raise ValueError(
                    f'{path}: entry "{name}" holds {item!r}, which is not a Datum with str _impath, '
                    "int _label, int _domain and str _classname."
                )


def read_datum_pickle(path):
    """Load a pickle of {split name: [Datum, ...]} written by Dassl or by vlprompt, safely.

    Only `dassl.data.datasets.base_dataset.Datum`, `vlprompt.data.datasets.base_dataset.Datum`
    and builtin containers may appear; Datum objects are restored without running
    their constructor.

    Raises:
        UnsafePickleError: the pickle references any other class or function.
        ValueError: the content is not a dict of lists of Datum.
    """
    with open(path, "rb") as f:
        try:
            data = _DatumUnpickler(f).load()
        except UnsafePickleError as error:
            raise UnsafePickleError(
                f"Refusing to unpickle {path}: it references {error}, but this file may only contain "
                "Datum objects (dassl.data.datasets.base_dataset.Datum or "
                "vlprompt.data.datasets.base_dataset.Datum) in dicts and lists. Delete it if you "
                "do not trust where it came from."
            ) from None
    _check_datum_lists(data, path)
    return data


def read_datum_json(path):
    """Load {split name: [[impath, label, domain, classname], ...]} as {split name: [Datum, ...]}."""
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path} should hold a JSON object of lists, got {type(raw).__name__}.")
    data = {}
    for name, entries in raw.items():
        if not isinstance(entries, list) or any(
            not isinstance(entry, list) or len(entry) != 4 for entry in entries
        ):
            raise ValueError(f'{path}: "{name}" should be a list of [impath, label, domain, classname].')
        data[name] = [Datum.unchecked(impath, label, domain, cname) for impath, label, domain, cname in entries]
    _check_datum_lists(data, path)
    return data


def write_datum_json(data, path, compact=False):
    """Atomically write {split name: [Datum, ...]} as JSON lists [impath, label, domain, classname].

    `compact` drops the indentation (for large lists such as ImageNet's).
    """
    payload = {
        name: [[item.impath, item.label, item.domain, item.classname] for item in items]
        for name, items in data.items()
    }
    if compact:
        with atomic_write(path, "w") as f:
            json.dump(payload, f, separators=(",", ":"))
    else:
        write_json(payload, path)


def _relocated_path(impath, dataset_dir):
    """The path of `impath` under `dataset_dir` if it moved with the dataset folder, else None.

    Every occurrence of the dataset folder's name as a path component is tried
    (last first): the part after it, joined to `dataset_dir`, must be a file.
    """
    folder = os.path.basename(os.path.normpath(dataset_dir))
    parts = impath.replace("\\", "/").split("/")
    for index in reversed(range(len(parts))):
        if parts[index] == folder:
            candidate = os.path.join(dataset_dir, *parts[index + 1 :])
            if os.path.isfile(candidate):
                return candidate
    return None


def relocate_datums(data, dataset_dir, source):
    """Rewrite image paths that moved with the dataset folder (e.g. a cache from another machine).

    An existing path is kept. A missing one is replaced by its tail after the
    dataset folder's name, joined to `dataset_dir`, if that file exists.

    Args:
        data (dict[str, list[Datum]]): loaded lists.
        dataset_dir (str): the dataset folder on this machine.
        source (str): the file the lists come from, for the error message.

    Returns:
        dict[str, list[Datum]]: the same lists, with rewritten items where needed.

    Raises:
        MissingImagesError: a path neither exists nor can be found under `dataset_dir`.
    """
    relocated, missing, total = {}, [], 0
    for name, items in data.items():
        kept = []
        for item in items:
            total += 1
            if os.path.isfile(item.impath):
                kept.append(item)
                continue
            new_path = _relocated_path(item.impath, dataset_dir)
            if new_path is None:
                missing.append(item.impath)
            else:
                kept.append(Datum.unchecked(new_path, item.label, item.domain, item.classname))
        relocated[name] = kept
    if missing:
        raise MissingImagesError(
            _missing_images_message(missing, total, source)
            + f"\nNone of them was found under {dataset_dir} either. Delete {source} to sample "
            "the few-shot data again (the same seed and split give the same selection), or restore the images."
        )
    return relocated


# ---------------------------------------------------------------- few-shot cache

def fewshot_cache_stem(dataset_dir, num_shots, seed):
    """`<dataset_dir>/split_fewshot/shot_{K}-seed_{SEED}` (without extension)."""
    return os.path.join(dataset_dir, FEWSHOT_DIRNAME, f"shot_{num_shots}-seed_{seed}")


def load_datum_cache(stem, dataset_dir, announce=None):
    """Load `<stem>.pkl` (Dassl's pickle) or else `<stem>.json` (ours), with moved paths rewritten.

    The pickle is read with the restricted unpickler (`read_datum_pickle`), so only
    Datum objects in dicts and lists load; paths that moved with the dataset folder
    are rewritten (`relocate_datums`). `announce`, if given, is printed before the
    file's path.

    Returns:
        (str, dict[str, list[Datum]]) | None: the file read and its lists; None if neither file exists.
    """
    for path, reader in ((stem + ".pkl", read_datum_pickle), (stem + ".json", read_datum_json)):
        if os.path.isfile(path):
            if announce:
                print(f"{announce} {path}")
            return path, relocate_datums(reader(path), dataset_dir, path)
    return None


def load_fewshot_cache(dataset_dir, num_shots, seed):
    """Load the cached few-shot lists, or return None if there is no cache.

    Dassl's `shot_K-seed_S.pkl` is preferred over our `shot_K-seed_S.json`.

    Returns:
        dict[str, list[Datum]] | None: {"train": [...], "val": [...]} ({"train"} for ImageNet).
    """
    stem = fewshot_cache_stem(dataset_dir, num_shots, seed)
    loaded = load_datum_cache(stem, dataset_dir, announce="Loading preprocessed few-shot data from")
    return None if loaded is None else loaded[1]


def save_fewshot_cache(dataset_dir, num_shots, seed, data):
    """Write the few-shot lists to `shot_K-seed_S.json` (atomically) and return its path."""
    path = fewshot_cache_stem(dataset_dir, num_shots, seed) + ".json"
    print(f"Saving preprocessed few-shot data to {path}")
    write_datum_json(data, path)
    return path


def _fewshot_with_cache(dataset_dir, num_shots, seed, train, val):
    """Few-shot train (K) and val (min(K, 4)) from the cache, or sampled and cached.

    `val` None (ImageNet): only train is sampled and cached.
    """
    if seed < 0:
        warnings.warn(
            f"SEED is {seed} (unseeded run): the few-shot cache "
            f"{fewshot_cache_stem(dataset_dir, num_shots, seed)}.* is shared by every unseeded "
            f"{num_shots}-shot run, so all of them use the same selection; set SEED >= 0 to get "
            "one selection per seed.",
            stacklevel=3,
        )
    splits = ("train",) if val is None else ("train", "val")
    data = load_fewshot_cache(dataset_dir, num_shots, seed)
    if data is not None:
        absent = [name for name in splits if name not in data]
        if absent:
            raise ValueError(
                f"The few-shot cache {fewshot_cache_stem(dataset_dir, num_shots, seed)} has no "
                f"{' / '.join(absent)} list; delete it to sample again."
            )
        _check_cache_matches_split(data, {"train": train, "val": val}, dataset_dir, num_shots, seed)
        return data["train"], (None if val is None else data["val"])

    train = generate_fewshot_dataset(train, num_shots=num_shots)
    data = {"train": train}
    if val is not None:
        val = generate_fewshot_dataset(val, num_shots=min(num_shots, 4))
        data["val"] = val
    save_fewshot_cache(dataset_dir, num_shots, seed, data)
    return train, val


def _item_key(item, folder):
    """(path below the dataset folder `folder`, label, classname): an item's identity across machines."""
    parts = os.path.normpath(item.impath).replace("\\", "/").split("/")
    tail = parts[len(parts) - parts[::-1].index(folder):] if folder in parts else parts
    return "/".join(tail), item.label, item.classname


def _check_cache_matches_split(cached, current, dataset_dir, num_shots, seed):
    """Raise DatasetContentError if a cached few-shot item is not in the split it was sampled from.

    Args:
        cached: {"train": [Datum], "val": [Datum]} from the cache.
        current: {"train": [Datum], "val": [Datum] or None}: the lists of the current split.
    """
    folder = os.path.basename(os.path.normpath(dataset_dir))
    for name, items in current.items():
        if items is None:
            continue
        known = {_item_key(item, folder) for item in items}
        foreign = [item for item in cached[name] if _item_key(item, folder) not in known]
        if foreign:
            stem = fewshot_cache_stem(dataset_dir, num_shots, seed)
            raise DatasetContentError(
                f"The few-shot cache {stem}.* does not match the current split: {len(foreign)} of its "
                f"{len(cached[name])} {name} items are not in the split's {name} list with the same label and "
                f'class name (e.g. "{foreign[0].impath}", label {foreign[0].label}, "{foreign[0].classname}"). '
                "The split file or the dataset changed after the cache was written; delete the cache to sample again."
            )


def prepare_coop_splits(cfg, dataset_dir, build_split, split_path=None, path_prefix=None):
    """The CoOp-family dataset pipeline (engine.md §4.5 steps 1–4).

    1. Create `<dataset_dir>/split_fewshot/` (at every construction, as CoOp does).
    2. If `split_path` is a file: `read_split(split_path, path_prefix)`; otherwise
       `build_split()` and, if `split_path` is given, `save_split` to it.
    3. If DATASET.NUM_SHOTS K >= 1: train (K per class) and val (min(K, 4)) from
       the cache `<dataset_dir>/split_fewshot/shot_K-seed_SEED.*`, or sampled and cached.
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

    Returns:
        (list[Datum], list[Datum] | None, list[Datum]): train, val, test.
    """
    mkdir_if_missing(os.path.join(dataset_dir, FEWSHOT_DIRNAME))
    if split_path is not None and os.path.isfile(split_path):
        train, val, test = read_split(split_path, path_prefix)
    else:
        train, val, test = build_split()
        if split_path is not None:
            save_split(train, val, test, split_path, path_prefix)

    num_shots = cfg.DATASET.NUM_SHOTS
    if num_shots >= 1:
        train, val = _fewshot_with_cache(dataset_dir, num_shots, cfg.SEED, train, val)

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
