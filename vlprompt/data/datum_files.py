"""Files of Datum lists: Dassl's pickles (read safely), our JSON, and image paths that moved.

* `read_datum_pickle`: {split name: [Datum, ...]} from a pickle written by Dassl or vlprompt,
  with an unpickler that resolves only Datum and builtin containers (`UnsafePickleError`
  for anything else) and checks the content's types;
* `read_datum_json` / `write_datum_json`: the same lists as JSON lists
  [impath, label, domain, classname] (written atomically); with ``relative_to`` a folder, the
  paths below it are written relative to it (forward slashes), so that the file stays true
  when the folder is copied or moved, and relative paths are read back joined to it;
* `relocate_datums`: image paths that moved with the dataset folder (a cache written on
  another machine) rewritten to the folder on this machine; `MissingImagesError` names the
  paths found nowhere.
"""
import builtins
import json
import os
import pickle

from vlprompt.data.datasets.base_dataset import DATASETS_DOC, Datum, MissingImagesError
from vlprompt.utils import atomic_write, read_json, write_json

__all__ = [
    "UnsafePickleError",
    "missing_images_message",
    "read_datum_json",
    "read_datum_pickle",
    "relocate_datums",
    "write_datum_json",
]

MAX_LISTED_PATHS = 5


def missing_images_message(missing, total, source):
    """The message of MissingImagesError: how many of `total` images listed in `source` are missing, the first few."""
    shown = "\n".join(f"  {path}" for path in missing[:MAX_LISTED_PATHS])
    return (
        f"{len(missing)} of {total} images listed in {source} do not exist (an incomplete download, "
        f"or DATASET.ROOT pointing at another copy? {DATASETS_DOC} gives each dataset's layout). "
        f"First {min(len(missing), MAX_LISTED_PATHS)}:\n{shown}"
    )


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


def read_datum_json(path, relative_to=None):
    """Load {split name: [[impath, label, domain, classname], ...]} as {split name: [Datum, ...]}.

    A relative impath is joined to ``relative_to`` (the folder it was written relative to); an
    absolute one is kept.
    """
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path} should hold a JSON object of lists, got {type(raw).__name__}.")
    data = {}
    for name, entries in raw.items():
        if not isinstance(entries, list) or any(
            not isinstance(entry, list) or len(entry) != 4 for entry in entries
        ):
            raise ValueError(f'{path}: "{name}" should be a list of [impath, label, domain, classname].')
        data[name] = [Datum.unchecked(_joined(relative_to, impath), label, domain, cname)
                      for impath, label, domain, cname in entries]
    _check_datum_lists(data, path)
    return data


def _joined(folder, impath):
    """``impath`` joined to ``folder`` when it is a relative path (str) and ``folder`` is given."""
    if folder is None or not isinstance(impath, str) or os.path.isabs(impath):
        return impath
    return os.path.join(folder, *impath.split("/"))


def _relative(impath, folder):
    """``impath`` relative to ``folder`` (forward slashes) when it lies below it, else unchanged."""
    if folder is None:
        return impath
    relative = os.path.relpath(os.path.normpath(impath), os.path.normpath(folder))
    return impath if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative.replace(os.sep, "/")


def write_datum_json(data, path, compact=False, relative_to=None):
    """Atomically write {split name: [Datum, ...]} as JSON lists [impath, label, domain, classname].

    `compact` drops the indentation (for large lists such as ImageNet's). `relative_to`: a folder;
    the paths below it are written relative to it (module docstring).
    """
    payload = {
        name: [[_relative(item.impath, relative_to), item.label, item.domain, item.classname] for item in items]
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
            missing_images_message(missing, total, source)
            + f"\nNone of them was found under {dataset_dir} either. Delete {source} to sample "
            "the few-shot data again (the same seed and split give the same selection), or restore the images."
        )
    return relocated
