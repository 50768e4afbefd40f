"""Reading a user's own labelled images: a class-per-folder tree or a list file, and a names file.

The reader behind the ImageFolder dataset (datasets/image_folder.py); it reads and checks, and
writes nothing. Both readers return an :class:`ImageTree`: the class names in label order and
one :class:`TreeImage` per image (a path relative to the root, a label, the split a list file
gives or None).

* :func:`read_class_folders`: ``ROOT/<class folder>/**/<image>``, as torchvision's ImageFolder
  reads it: files with an extension of :data:`IMAGE_EXTENSIONS` (any case), hidden files and
  folders (a leading ".") ignored, symbolic links followed, nested folders belong to their
  top-level class folder, class folders in sorted order = label order. The folders the
  pipeline writes into the root (:data:`RESERVED_FOLDERS`) are not classes.
* :func:`read_list_file`: a CSV (rows ``path,label[,split]``, or any column order under a header
  row naming the columns) or JSON (a list of ``[path, label(, split)]`` or of objects with the
  keys ``path``, ``label`` and optionally ``split``) file; paths relative to the root. A header
  or key may use the usual other names (:data:`COLUMN_NAMES`: ``file``, ``filename``, ``image``
  for the path; ``class``, ``category`` for the label; ``subset`` for the split); a first CSV row
  that looks like a header (no cell holds a "." or "/") but names other columns is refused.
* :func:`read_names_file`: lines ``KEY class name`` (a folder name or a list label, then the
  class name, as CoOp's ImageNet ``classnames.txt``); blank lines and ``#`` comments skipped.

Labels: with a names file, its line order (it must name every class); without one, the sorted
class keys (numerically when every list label is an integer). A class name is the names file's
name, else the key with underscores as spaces. Two keys whose names normalise to one (case,
underscores and spaces ignored) are refused: CLIP's tokenizer could not tell them apart.

Every problem raises :class:`ImageTreeError` (a DatasetLayoutError: train.py prints one
paragraph and exits with status 2) naming the files and what was expected. A file that is
not an image (another extension) is refused with the others listed, or with ``skip_others``
left out and listed.
"""
import csv
import json
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from vlprompt.utils import listdir_nohidden

from .datasets import DatasetLayoutError
from .fewshot_cache import FEWSHOT_DIRNAME

__all__ = [
    "COLUMN_NAMES",
    "IMAGE_EXTENSIONS",
    "RESERVED_FOLDERS",
    "SPLIT_NAMES",
    "ImageTree",
    "ImageTreeError",
    "TreeImage",
    "is_image_file",
    "normalised_name",
    "read_class_folders",
    "read_list_file",
    "read_names_file",
]

# torchvision's ImageFolder extensions, compared case-insensitively.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Folders the pipeline writes into DATASET.ROOT (the few-shot cache, the default feature cache).
RESERVED_FOLDERS = (FEWSHOT_DIRNAME, "feature_cache")
SPLIT_NAMES = ("train", "val", "test")
# The names a list file's header (or a JSON object's keys) may give each column, any case.
COLUMN_NAMES = {
    "path": ("path", "file", "filename", "file_name", "filepath", "file_path", "image", "image_path", "img",
             "impath"),
    "label": ("label", "class", "class_name", "classname", "category", "target"),
    "split": ("split", "subset", "partition"),
}
_COLUMN_OF = {name: column for column, names in COLUMN_NAMES.items() for name in names}
_SHOWN = 10


class ImageTreeError(DatasetLayoutError):
    """The user's image folder, list file or names file is not laid out as expected."""


@dataclass(frozen=True)
class TreeImage:
    """One image: ``path`` relative to the root (forward slashes), its label, its split (or None)."""

    path: str
    label: int
    split: Optional[str] = None


@dataclass(frozen=True)
class ImageTree:
    """What a reader found.

    Attributes:
        classnames: class names, index = label.
        keys: the folder name or list label of each class, index = label.
        images: one TreeImage per image, by label, then path.
        source: what was read (a folder or a file), for messages.
    """

    classnames: Tuple[str, ...]
    keys: Tuple[str, ...]
    images: Tuple[TreeImage, ...]
    source: str


def normalised_name(name):
    """The form two class names must not share: underscores as spaces, runs of spaces as one, case folded."""
    return " ".join(name.replace("_", " ").split()).casefold()


def _listing(paths, shown=_SHOWN):
    """The first ``shown`` of ``paths`` on indented lines, then how many more."""
    lines = [f"  {path}" for path in paths[:shown]]
    if len(paths) > shown:
        lines.append(f"  ... and {len(paths) - shown} more")
    return "\n".join(lines)


def is_image_file(name):
    """Whether ``name`` has one of IMAGE_EXTENSIONS (any case)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _walk_files(folder):
    """Relative paths (forward slashes, sorted) of the non-hidden files below ``folder``; links
    are followed, a folder reached twice through links is read once."""
    found, seen = [], set()
    for current, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        relative = os.path.relpath(current, folder)
        for name in files:
            if not name.startswith("."):
                found.append(name if relative == "." else f"{relative}/{name}".replace(os.sep, "/"))
    return sorted(found)


def _refuse_others(others, skip_others, where):
    """Raise ImageTreeError for files that are not images, unless ``skip_others`` (then they are printed)."""
    if not others:
        return
    extensions = " ".join(IMAGE_EXTENSIONS)
    if skip_others:
        print(f"Left out {len(others)} file(s) of {where} that are not images (DATASET.SKIP_BAD_IMAGES; "
              f"image extensions: {extensions}):\n{_listing(others)}")
        return
    raise ImageTreeError(
        f"{len(others)} file(s) of {where} are not images (an image ends in one of {extensions}, any case):\n"
        f"{_listing(others)}\nMove them out of the tree, or set DATASET.SKIP_BAD_IMAGES True to leave them out."
    )


def _labels_and_names(keys, names, names_path, what):
    """(keys in label order, class names in label order) for the class ``keys`` found.

    With a names file (``names``: key -> name, in file order) the file's order; it must name
    every key and name no key that has no image. Checks that no two names normalise to one.
    """
    if names is None:
        numeric = all(re.fullmatch(r"-?\d+", key) for key in keys)
        ordered = sorted(keys, key=int) if numeric else sorted(keys)
        classnames = [" ".join(key.replace("_", " ").split()) for key in ordered]
    else:
        unnamed = sorted(set(keys) - set(names))
        if unnamed:
            raise ImageTreeError(
                f"the names file {names_path} has no line for {len(unnamed)} {what}(s) "
                f"(expected a line 'KEY class name' for each):\n{_listing(unnamed)}"
            )
        empty = [key for key in names if key not in set(keys)]
        if empty:
            raise ImageTreeError(
                f"{len(empty)} class(es) of the names file {names_path} have no image (every class "
                f"needs at least one; remove the line or add its images):\n{_listing(empty)}"
            )
        ordered = list(names)
        classnames = [names[key] for key in ordered]
    by_form = {}
    for key, name in zip(ordered, classnames):
        by_form.setdefault(normalised_name(name), []).append(f'{what} "{key}" (class name "{name}")')
    clashes = [" and ".join(group) for group in by_form.values() if len(group) > 1]
    if clashes:
        raise ImageTreeError(
            f"{len(clashes)} class name(s) are given by more than one {what}, once case, underscores and "
            f"spaces are ignored (CLIP's tokenizer could not tell them apart):\n{_listing(clashes)}\n"
            f"Merge the {what}s or give them distinct names (a names file can rename them)."
        )
    return ordered, classnames


def read_names_file(path):
    """{key: class name} from a names file (module docstring), in file order.

    Raises:
        ImageTreeError: the file is missing, a line has no class name, or a key repeats.
    """
    if not os.path.isfile(path):
        raise ImageTreeError(f"the names file {path} does not exist (expected lines 'KEY class name')")
    names = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.split(maxsplit=1)
            if len(parts) < 2:
                raise ImageTreeError(
                    f'line {number} of the names file {path} is "{text}": expected "KEY class name" (a folder '
                    "name or list label, a space, then the class name)"
                )
            key, name = parts
            if key in names:
                raise ImageTreeError(f'the names file {path} names "{key}" twice (lines give one class each)')
            names[key] = name.strip()
    if not names:
        raise ImageTreeError(f"the names file {path} names no class (expected lines 'KEY class name')")
    return names


def read_class_folders(root, names=None, names_path="", skip_others=False):
    """The images of a class-per-folder tree ``root/<class folder>/**/<image>`` (module docstring).

    Args:
        root: the tree's folder.
        names: {folder name: class name} from a names file, or None (names from the folders).
        names_path: the names file, for messages.
        skip_others: leave out (and list) files that are not images instead of refusing them.

    Raises:
        ImageTreeError: no class folder, an empty class folder, files that are not images,
            names that clash, or a names file that does not match the folders.
    """
    folders = [
        name for name in listdir_nohidden(root, sort=True)
        if os.path.isdir(os.path.join(root, name)) and name not in RESERVED_FOLDERS
    ]
    if not folders:
        raise ImageTreeError(f"{root} has no class folder (expected one folder of images per class)")
    files = {folder: _walk_files(os.path.join(root, folder)) for folder in folders}
    others = [f"{folder}/{name}" for folder in folders for name in files[folder] if not is_image_file(name)]
    _refuse_others([os.path.join(root, path) for path in others], skip_others, f"the class folders of {root}")
    images = {folder: [name for name in files[folder] if is_image_file(name)] for folder in folders}
    empty = [os.path.join(root, folder) for folder in folders if not images[folder]]
    if empty:
        raise ImageTreeError(
            f"{len(empty)} class folder(s) hold no image (every class needs at least one; a class folder "
            f"holds files ending in {' '.join(IMAGE_EXTENSIONS)}, possibly in sub-folders):\n{_listing(empty)}"
        )
    ordered, classnames = _labels_and_names(folders, names, names_path, "folder")
    tree_images = tuple(
        TreeImage(f"{folder}/{name}", label) for label, folder in enumerate(ordered) for name in images[folder]
    )
    return ImageTree(tuple(classnames), tuple(ordered), tree_images, root)


def _list_rows(path):
    """Rows (path, label, split or None) of a CSV or JSON list file, with their line or item number."""
    what = f"the list file {path}"
    if path.lower().endswith(".json"):
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as error:
                raise ImageTreeError(f"{what} is not valid JSON ({error})") from None
        if not isinstance(data, list):
            raise ImageTreeError(f"{what} holds a JSON {type(data).__name__}; expected a list of rows")
        rows = []
        for number, item in enumerate(data, 1):
            columns = _columns(list(item)) if isinstance(item, dict) else None
            if columns is not None:
                named = dict(zip(columns, item.values()))
                rows.append((number, named["path"], named["label"], named.get("split")))
            elif isinstance(item, list) and len(item) in (2, 3):
                rows.append((number, item[0], item[1], item[2] if len(item) == 3 else None))
            else:
                raise ImageTreeError(
                    f"item {number} of {what} is {item!r}; expected [path, label], [path, label, split] or "
                    '{"path": ..., "label": ..., "split": ...} (split optional; other key names: '
                    f"{_names_listing()})"
                )
        return rows, "item"
    with open(path, encoding="utf-8", newline="") as f:
        lines = [(number, row) for number, row in enumerate(csv.reader(f), 1) if any(cell.strip() for cell in row)]
    order = None  # without a header: path,label[,split]
    if lines:
        number, first = lines[0]
        columns = _columns(first)
        if columns is not None:
            order, lines = columns, lines[1:]
        elif not any("." in cell or "/" in cell for cell in first):
            raise ImageTreeError(
                f"line {number} of {what} ({','.join(first)}) looks like a header, but its column names are not "
                f"recognised; name the columns {_names_listing()} (any order, any case), or remove the line to "
                "read the columns as path,label[,split]"
            )
    rows = []
    for number, row in lines:
        if len(row) not in ((2, 3) if order is None else (len(order),)):
            expected = ("path,label or path,label,split" if order is None
                        else f"{','.join(order)} (the header's columns)")
            raise ImageTreeError(
                f"line {number} of {what} has {len(row)} field(s) ({','.join(row)}); expected {expected}"
            )
        named = dict(zip(order or ("path", "label", "split"), (cell.strip() for cell in row)))
        rows.append((number, named["path"], named["label"], named.get("split")))
    return rows, "line"


def _columns(names):
    """The columns ("path", "label", "split") that header cells or object keys ``names`` name, in
    their order; None unless they name path and label, each column at most once, and nothing else."""
    columns = [_COLUMN_OF.get(str(name).strip().lower()) for name in names]
    if None in columns or len(set(columns)) != len(columns) or not {"path", "label"} <= set(columns):
        return None
    return columns


def _names_listing():
    """"path (or file, ...), label (or class, ...), split (optional; or subset, ...)" for messages."""
    parts = []
    for column, names in COLUMN_NAMES.items():
        optional = "optional; " if column == "split" else ""
        parts.append(f"{column} ({optional}or {', '.join(names[1:])})")
    return ", ".join(parts)


def read_list_file(root, path, names=None, names_path="", skip_others=False):
    """The images listed by a CSV or JSON list file, paths relative to ``root`` (module docstring).

    A row's split, when given, is one of SPLIT_NAMES; either every row gives one or none does.

    Raises:
        ImageTreeError: a malformed row, an empty list, listed files that do not exist, a path
            listed twice or outside ``root``, files that are not images, a label that is not in
            the names file, a bad or partial split column, or names that clash.
    """
    if not os.path.isfile(path):
        raise ImageTreeError(f"the list file {path} does not exist (expected CSV rows path,label[,split] or JSON)")
    rows, unit = _list_rows(path)
    if not rows:
        raise ImageTreeError(f"the list file {path} lists no image (expected rows path,label[,split])")
    entries, seen, missing, outside, others, repeated = [], set(), [], [], [], []
    for number, image, label, split in rows:
        if not isinstance(image, str) or not image or isinstance(label, (bool, float)) or label in ("", None):
            raise ImageTreeError(f"{unit} {number} of the list file {path} has path {image!r} and label {label!r}; "
                                 "expected a non-empty path and a label (a name or an integer)")
        absolute = os.path.normpath(os.path.join(root, image))
        relative = os.path.relpath(absolute, root).replace(os.sep, "/")
        if relative.startswith("../"):
            outside.append(f"{unit} {number}: {image}")
        elif relative in seen:
            repeated.append(f"{unit} {number}: {image}")
        elif not is_image_file(relative):
            others.append(absolute)
        elif not os.path.isfile(absolute):
            missing.append(f"{unit} {number}: {absolute}")
        else:
            entries.append((relative, str(label), split))
        seen.add(relative)
    for problem, listed in (("lie outside the root " + root, outside), ("are listed twice", repeated),
                            ("do not exist", missing)):
        if listed:
            raise ImageTreeError(f"{len(listed)} image(s) of the list file {path} {problem}:\n{_listing(listed)}")
    _refuse_others(others, skip_others, f"the list file {path}")
    if names is not None:
        unknown = sorted({label for _, label, _ in entries} - set(names))
        if unknown:
            raise ImageTreeError(
                f"{len(unknown)} label(s) of the list file {path} are not in the names file {names_path} "
                f"(expected one of its keys: {', '.join(list(names)[:_SHOWN])}{' ...' if len(names) > _SHOWN else ''}):"
                f"\n{_listing(unknown)}"
            )
    given = [split for _, _, split in entries if split not in (None, "")]
    if given:
        bad = sorted({str(split) for split in given if split not in SPLIT_NAMES})
        unset = len(entries) - len(given)
        if bad or unset:
            found = f"holds {', '.join(repr(s) for s in bad)}" if bad else f"is empty in {unset} row(s)"
            raise ImageTreeError(
                f"the split column of the list file {path} {found}; every row needs one of "
                f"{', '.join(SPLIT_NAMES)} (or leave the column out to split by DATASET.IMAGE_FOLDER.SPLIT_RATIO)"
            )
    ordered, classnames = _labels_and_names(sorted({label for _, label, _ in entries}), names, names_path, "label")
    label_of = {key: index for index, key in enumerate(ordered)}
    tree_images = tuple(sorted(
        (TreeImage(relative, label_of[label], split or None) for relative, label, split in entries),
        key=lambda image: (image.label, image.path),
    ))
    return ImageTree(tuple(classnames), tuple(ordered), tree_images, path)
