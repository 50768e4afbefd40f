"""Per-class text descriptions in the upstream per-dataset JSON format (TAC's ``descriptions/``).

A dataset's descriptions are one file ``<stem>_prompt.json`` holding
``{"<class name>": ["<sentence>", ...], ...}``, keyed by the class names with "_" written as
spaces (upstream FushengHao/TAC ships them for the 15 datasets of the benchmark as
``descriptions/<stem>_prompt.json``). The stem is a fact of the dataset class, its
``description_stem`` (upstream's, e.g. FGVCAircraft's "fgvc"; a class registered in
DATASET_REGISTRY). A dataset whose descriptions are generated rather than downloaded registers
its generator (:func:`register_generated_descriptions`; the synthetic sets of
``datasets/synthetic.py`` do, with :mod:`vlprompt.synthetic.descriptions`), and its file is
written on first use.

:func:`read_class_descriptions` returns the sentences of the classes asked for, in their
order, and raises :class:`DescriptionsError` naming the file and what is wrong with it.
"""
import json
import os
from typing import Callable, Dict, List

from vlprompt.fileio import atomic_write

from .datasets import DATASET_REGISTRY

__all__ = [
    "DescriptionsError", "check_descriptions_file", "descriptions_file",
    "read_class_descriptions", "register_generated_descriptions",
]

UPSTREAM = "https://github.com/FushengHao/TAC (folder descriptions/)"


class DescriptionsError(FileNotFoundError):
    """A descriptions file is missing, unreadable, malformed or lacks some classes."""


# DATASET.NAME -> () -> {class name: [sentence, ...]}, filled by register_generated_descriptions.
_GENERATED: Dict[str, Callable[[], Dict[str, List[str]]]] = {}


def register_generated_descriptions(dataset_name, table):
    """Declare that the descriptions of ``dataset_name`` (DATASET.NAME; its file named by its class's
    ``description_stem``) are written on first use with ``table()`` ({class name: [sentence, ...]}).
    Registering a name again replaces its entry (a module re-import)."""
    _GENERATED[dataset_name] = table


def descriptions_file(folder, dataset_name):
    """Path of the descriptions of ``dataset_name`` (DATASET.NAME) in ``folder``.

    Raises:
        DescriptionsError: the dataset has no known file stem.
    """
    stem = _description_stem(dataset_name)
    if not stem:
        known = [name for name in DATASET_REGISTRY.registered_names() if _description_stem(name)]
        raise DescriptionsError(
            f"No descriptions file name is known for the dataset {dataset_name!r} (known: {', '.join(known)}); "
            "set the description_stem attribute of its dataset class and write <stem>_prompt.json in the "
            "upstream format."
        )
    return os.path.join(folder, f"{stem}_prompt.json")


def _description_stem(dataset_name):
    """The ``description_stem`` of the dataset class registered as ``dataset_name``; "" when none."""
    if dataset_name not in DATASET_REGISTRY:
        return ""
    return getattr(DATASET_REGISTRY.get(dataset_name), "description_stem", "")


def _write_generated(path, dataset_name):
    print(f"Writing the generated descriptions of {dataset_name} to {path} (first use)")
    with atomic_write(path, "w") as f:
        json.dump(_GENERATED[dataset_name](), f, indent=1)


def _malformed(path, what):
    raise DescriptionsError(f'{path} {what}; expected {{"<class name>": ["<sentence>", ...], ...}} (upstream TAC format).')


def read_class_descriptions(folder, dataset_name, classnames):
    """The descriptions of ``classnames`` from ``folder``'s file of ``dataset_name``.

    A generated file (:func:`register_generated_descriptions`) is written first when it is missing.

    Args:
        folder: the folder holding ``<stem>_prompt.json`` files.
        dataset_name: DATASET.NAME.
        classnames: C class names ("_" is read as a space, as upstream does).

    Returns:
        list of C lists of sentences (each non-empty), in the order of ``classnames``.

    Raises:
        DescriptionsError: the file is missing (with how to get it), is not a JSON object of
            lists of sentences, or lacks some of the classes (named).
    """
    path = descriptions_file(folder, dataset_name)
    if not os.path.isfile(path):
        _missing(folder, dataset_name, path)
        _write_generated(path, dataset_name)
    table = _read_table(path)
    names = [name.replace("_", " ") for name in classnames]
    missing = [name for name in names if name not in table]
    if missing:
        raise DescriptionsError(
            f"{path} has no descriptions for {len(missing)} of the {len(names)} classes: {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''} (keys are class names with '_' written as spaces; "
            f"the file has e.g. {list(table)[:5]})."
        )
    return [list(table[name]) for name in names]


def check_descriptions_file(folder, dataset_name):
    """What :func:`read_class_descriptions` checks without the class names: the file exists (a
    generated one may be missing: it is written on first use) and is a JSON object of lists of
    sentences.

    Raises:
        DescriptionsError: as :func:`read_class_descriptions`.
    """
    path = descriptions_file(folder, dataset_name)
    if os.path.isfile(path):
        _read_table(path)
    else:
        _missing(folder, dataset_name, path)


def _missing(folder, dataset_name, path):
    """DescriptionsError for the missing file ``path``, unless it is a generated one."""
    if dataset_name not in _GENERATED:
        raise DescriptionsError(
            f"The class descriptions of {dataset_name} are missing: {path} does not exist. Copy upstream's "
            f"{os.path.basename(path)} from {UPSTREAM} into {folder}, or point TRAINER.TAC.DESCRIPTIONS at "
            "the folder that holds it."
        )


def _read_table(path):
    """The file's {class name: [sentence, ...]}; DescriptionsError when it is not that."""
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as error:
        raise DescriptionsError(f"Cannot read the descriptions file {path}: {error}") from None
    if not isinstance(table, dict):
        _malformed(path, "is not a JSON object")
    bad = [key for key, value in table.items()
           if not isinstance(value, list) or not value or not all(isinstance(s, str) and s.strip() for s in value)]
    if bad:
        _malformed(path, f"has entries that are not non-empty lists of sentences: {bad[:5]}")
    return table
