"""The few-shot cache: `<dataset_dir>/split_fewshot/shot_{K}-seed_{SEED}.{pkl,json}`.

Dassl writes `shot_{K}-seed_{SEED}.pkl` (a pickle of Datum objects); we read those with the
restricted unpickler of :mod:`vlprompt.data.datum_files` and write our own as
`shot_{K}-seed_{SEED}.json`. Both hold absolute image paths; paths that moved with the
dataset folder are rewritten on load. `fewshot_with_cache` is step 3 of the CoOp pipeline
(:func:`vlprompt.data.splits.prepare_coop_splits`): the cached selection if it matches the
current split, else a fresh sample (train K per class, val min(K, 4)) that is then cached.
"""
import os
import warnings

from vlprompt.data.checks import DatasetContentError
from vlprompt.data.datasets.base_dataset import generate_fewshot_dataset
from vlprompt.data.datum_files import read_datum_json, read_datum_pickle, relocate_datums, write_datum_json

__all__ = [
    "FEWSHOT_DIRNAME",
    "fewshot_cache_stem",
    "fewshot_with_cache",
    "load_datum_cache",
    "load_fewshot_cache",
    "save_fewshot_cache",
]

FEWSHOT_DIRNAME = "split_fewshot"


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


def fewshot_with_cache(dataset_dir, num_shots, seed, train, val):
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
