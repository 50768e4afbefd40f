"""The few-shot cache: `<dataset_dir>/split_fewshot/shot_{K}-seed_{SEED}.{pkl,json}`.

Dassl writes `shot_{K}-seed_{SEED}.pkl` (a pickle of Datum objects, absolute image paths); we
read those with the restricted unpickler of :mod:`vlprompt.data.datum_files` and write our own as
`shot_{K}-seed_{SEED}.json`, with image paths relative to the dataset folder (so a copied or
moved folder keeps its caches). `fewshot_with_cache` is step 3 of the CoOp pipeline
(:func:`vlprompt.data.splits.prepare_coop_splits`): the cached selection if it matches the
current split, else a fresh sample (train K per class, val min(K, 4)) that is then cached. A
cached absolute path (a Dassl pickle, a cache written by an earlier version or on another
machine) is matched to the split by its longest tail that is a path of the split, so it matches
wherever the folder is now.

The cache is read from the dataset folder, else from the ``store`` folder, and written to
``store`` (the dataset folder unless it cannot be written: :mod:`vlprompt.data.generated_files`).
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


def _read_cache(stem, dataset_dir, announce=None):
    """(path, {split name: [Datum]}) of `<stem>.pkl` or else `<stem>.json` (relative paths joined to
    `dataset_dir`, nothing else rewritten), or None if neither exists. `announce`, if given, is
    printed before the file's path."""
    for path, reader in ((stem + ".pkl", read_datum_pickle),
                         (stem + ".json", lambda json_path: read_datum_json(json_path, dataset_dir))):
        if os.path.isfile(path):
            if announce:
                print(f"{announce} {path}")
            return path, reader(path)
    return None


def load_datum_cache(stem, dataset_dir, announce=None):
    """Load `<stem>.pkl` (Dassl's pickle) or else `<stem>.json` (ours), with moved paths rewritten.

    The pickle is read with the restricted unpickler (`read_datum_pickle`), so only
    Datum objects in dicts and lists load; relative paths of the JSON are joined to
    `dataset_dir`; absolute paths that moved with the dataset folder are rewritten
    (`relocate_datums`). `announce`, if given, is printed before the file's path.

    Returns:
        (str, dict[str, list[Datum]]) | None: the file read and its lists; None if neither file exists.
    """
    loaded = _read_cache(stem, dataset_dir, announce)
    if loaded is None:
        return None
    path, data = loaded
    return path, relocate_datums(data, dataset_dir, path)


def load_fewshot_cache(dataset_dir, num_shots, seed):
    """Load the cached few-shot lists, or return None if there is no cache.

    Dassl's `shot_K-seed_S.pkl` is preferred over our `shot_K-seed_S.json`.

    Returns:
        dict[str, list[Datum]] | None: {"train": [...], "val": [...]} ({"train"} for ImageNet).
    """
    stem = fewshot_cache_stem(dataset_dir, num_shots, seed)
    loaded = load_datum_cache(stem, dataset_dir, announce="Loading preprocessed few-shot data from")
    return None if loaded is None else loaded[1]


def save_fewshot_cache(dataset_dir, num_shots, seed, data, store=None):
    """Write the few-shot lists to `<store>/split_fewshot/shot_K-seed_S.json` (atomically; `store`
    defaults to `dataset_dir`), paths relative to `dataset_dir`, and return its path."""
    path = fewshot_cache_stem(store or dataset_dir, num_shots, seed) + ".json"
    print(f"Saving preprocessed few-shot data to {path}")
    write_datum_json(data, path, relative_to=dataset_dir)
    return path


def fewshot_with_cache(dataset_dir, num_shots, seed, train, val, store=None):
    """Few-shot train (K) and val (min(K, 4)) from the cache, or sampled and cached.

    `val` None (ImageNet): only train is sampled and cached. The cache is looked for in
    `dataset_dir`, then in `store`, and written to `store` (default: `dataset_dir`).
    """
    store = store or dataset_dir
    if seed < 0:
        warnings.warn(
            f"SEED is {seed} (unseeded run): the few-shot cache "
            f"{fewshot_cache_stem(store, num_shots, seed)}.* is shared by every unseeded "
            f"{num_shots}-shot run, so all of them use the same selection; set SEED >= 0 to get "
            "one selection per seed.",
            stacklevel=3,
        )
    splits = ("train",) if val is None else ("train", "val")
    for folder in dict.fromkeys((dataset_dir, store)):
        stem = fewshot_cache_stem(folder, num_shots, seed)
        loaded = _read_cache(stem, dataset_dir, announce="Loading preprocessed few-shot data from")
        if loaded is None:
            continue
        data = loaded[1]
        absent = [name for name in splits if name not in data]
        if absent:
            raise ValueError(f"The few-shot cache {stem} has no {' / '.join(absent)} list; delete it to sample again.")
        matched = _match_split(data, {"train": train, "val": val}, dataset_dir, stem)
        return matched["train"], matched.get("val")

    train = generate_fewshot_dataset(train, num_shots=num_shots)
    data = {"train": train}
    if val is not None:
        val = generate_fewshot_dataset(val, num_shots=min(num_shots, 4))
        data["val"] = val
    save_fewshot_cache(dataset_dir, num_shots, seed, data, store)
    return train, val


def _path_parts(path):
    return [part for part in os.path.normpath(path).replace("\\", "/").split("/") if part]


def _match_split(cached, current, dataset_dir, stem):
    """The cached few-shot lists as items of the current split, or DatasetContentError.

    A cached item is the split item with the same label and class name whose path is its path,
    or (a path written elsewhere: another machine, a copied or moved folder) whose path below
    `dataset_dir` is the longest tail of its path.

    Args:
        cached: {"train": [Datum], "val": [Datum]} from the cache.
        current: {"train": [Datum], "val": [Datum] or None}: the lists of the current split.
        stem: the cache file without its extension, for the message.

    Returns:
        {name: [Datum]} for each list of ``current`` that is not None, in the cache's order.
    """
    root = _path_parts(os.path.abspath(dataset_dir))
    matched = {}
    for name, items in current.items():
        if items is None:
            continue
        by_tail = {}
        for item in items:
            parts = _path_parts(os.path.abspath(item.impath))
            tail = parts[len(root):] if parts[:len(root)] == root else parts
            by_tail["/".join(tail)] = item
        found, foreign = [], []
        for item in cached[name]:
            parts = _path_parts(os.path.abspath(item.impath))
            tails = ("/".join(parts[start:]) for start in range(len(parts)))
            match = next((by_tail[tail] for tail in tails if tail in by_tail), None)
            if match is None or (match.label, match.classname) != (item.label, item.classname):
                foreign.append(item)
            else:
                found.append(match)
        if foreign:
            raise DatasetContentError(
                f"The few-shot cache {stem}.* does not match the current split: {len(foreign)} of its "
                f"{len(cached[name])} {name} items are not in the split's {name} list with the same label and "
                f'class name (e.g. "{foreign[0].impath}", label {foreign[0].label}, "{foreign[0].classname}"). '
                "The split file or the dataset changed after the cache was written; delete the cache to sample again."
            )
        matched[name] = found
    return matched
