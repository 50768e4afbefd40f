"""Checks of a dataset's content before anything trains on it: labels and image files.

* :func:`check_labels`: the training labels are exactly 0..C-1 (no class left without a
  training image, e.g. after few-shot sampling or base/new subsampling), every val/test label
  is one of them, and a label has one class name across the splits.
* :func:`check_images`: every image file that the run will read opens and passes PIL's
  ``verify()`` (DATASET.CHECK_IMAGES "verify"; a JPEG without its end-of-image marker, the
  mark of a truncated download, is also decoded), or fully decodes ("decode"). Unreadable
  files stop the run with their list (the full list is written to ``bad_images.txt``), or,
  with DATASET.SKIP_BAD_IMAGES, are left out of their split and counted.
"""
import os
import os.path as osp
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from vlprompt.run_layout import BAD_IMAGES_FILENAME, RESULTS_FILENAME
from vlprompt.utils import atomic_write

from .datasets import DatasetLayoutError

__all__ = [
    "IMAGE_CHECKS",
    "DatasetContentError",
    "BadImagesError",
    "check_labels",
    "check_images",
    "find_unreadable_images",
]

IMAGE_CHECKS = ("verify", "decode", "off")
_SHOWN = 10
_JPEG_END = b"\xff\xd9"
_JPEG_TAIL_BYTES = 1024


class DatasetContentError(DatasetLayoutError):
    """The dataset's lists are inconsistent (labels, class names) or hold unreadable images."""


class BadImagesError(DatasetContentError):
    """Image files of the run cannot be read."""


def _label_problems(dataset):
    """Sentences describing label problems of ``dataset`` ([] when consistent)."""
    problems = []
    train_labels = {item.label for item in dataset.train_x}
    if any(not isinstance(label, int) or label < 0 for label in train_labels):
        problems.append(f"training labels must be integers >= 0, got {sorted(map(repr, train_labels))[:10]}")
        return problems
    empty = sorted(set(range(max(train_labels) + 1)) - train_labels)
    if empty:
        problems.append(
            f"label(s) {empty[:20]} have no training image, so the {max(train_labels) + 1} classes the labels "
            "imply do not match the class names (a class emptied by few-shot sampling or subsampling, or a split "
            "file whose labels skip numbers)"
        )
    names = {}
    for split in ("train_x", "val", "test"):
        for item in getattr(dataset, split) or []:
            if item.label not in train_labels:
                problems.append(
                    f'the {split} item "{item.impath}" has label {item.label!r} ({item.classname}), which no '
                    f"training item has (training labels: 0..{max(train_labels)})"
                )
                break
            known = names.setdefault(item.label, (item.classname, split))
            if known[0] != item.classname:
                problems.append(
                    f'label {item.label} is "{known[0]}" in {known[1]} but "{item.classname}" in {split} '
                    f'("{item.impath}")'
                )
                break
    return problems


def check_labels(dataset):
    """Raise DatasetContentError unless the labels of ``dataset`` are consistent (module docstring)."""
    problems = _label_problems(dataset)
    if problems:
        raise DatasetContentError(
            f"Dataset {type(dataset).__name__} has inconsistent labels: " + "; ".join(problems)
            + ". Check its split file and the few-shot cache in split_fewshot/ (delete the cache to sample again)."
        )


def _image_problem(path, mode):
    """Why ``path`` cannot be used as an image (a short phrase), or None."""
    try:
        with Image.open(path) as image:
            if mode == "decode":
                image.load()
                return None
            image_format = image.format
            image.verify()
        if image_format == "JPEG":
            with open(path, "rb") as f:
                f.seek(max(os.path.getsize(path) - _JPEG_TAIL_BYTES, 0))
                complete = _JPEG_END in f.read()
            if not complete:
                with Image.open(path) as image:
                    image.load()
    except FileNotFoundError:
        return "file not found"
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, ... for broken files
        return f"{type(error).__name__}: {error}"
    return None


def find_unreadable_images(paths, mode="verify", num_threads=8):
    """{path: reason} for the files among ``paths`` that are not readable images.

    Args:
        paths: image paths (duplicates are checked once).
        mode: "verify" (open + verify, JPEGs without an end marker decoded) or "decode".
        num_threads: files checked in parallel.
    """
    unique = list(dict.fromkeys(paths))
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
        reasons = pool.map(lambda path: _image_problem(path, mode), unique)
    return {path: reason for path, reason in zip(unique, reasons) if reason is not None}


def check_images(splits, mode="verify", skip=False, report_dir=None):
    """Check the image files of ``splits``; stop, or leave unreadable ones out (in place).

    Args:
        splits: {split name: list of Datum} (the lists the loaders read).
        mode: one of IMAGE_CHECKS ("off" checks nothing).
        skip: leave unreadable images out of their list instead of raising.
        report_dir: the run folder, where ``bad_images.txt`` (one "path<TAB>reason" line per file;
            :mod:`vlprompt.run_layout`) is written when something is unreadable; None writes nothing.

    Returns:
        {split name: number of images left out} (all zeros unless ``skip``).

    Raises:
        BadImagesError: unreadable images and not ``skip``: counts per split, the first paths
            with their reasons, and where the full list is.
    """
    skipped = {name: 0 for name in splits}
    if mode == "off" or not splits:
        return skipped
    bad = find_unreadable_images([item.impath for items in splits.values() for item in items], mode)
    if not bad:
        return skipped
    counts = {name: sum(item.impath in bad for item in items) for name, items in splits.items()}
    report = None
    if report_dir is not None:
        report = osp.join(report_dir, BAD_IMAGES_FILENAME)
        with atomic_write(report, "w") as f:
            f.writelines(f"{path}\t{reason}\n" for path, reason in bad.items())
    per_split = ", ".join(f"{name}: {count}" for name, count in counts.items() if count)
    where = f' All of them are listed in "{report}".' if report else ""
    if skip:
        for name, items in splits.items():
            items[:] = [item for item in items if item.impath not in bad]
        print(f"Left out {len(bad)} unreadable image(s) (DATASET.SKIP_BAD_IMAGES; {per_split}).{where}")
        return counts
    shown = "\n".join(f"  {path}  ({reason})" for path, reason in list(bad.items())[:_SHOWN])
    raise BadImagesError(
        f"{len(bad)} image file(s) used by this run cannot be read ({per_split}); nothing was trained. "
        f"First {min(len(bad), _SHOWN)}:\n{shown}\n{where.strip()} Replace or re-download them, or set "
        f"DATASET.SKIP_BAD_IMAGES True to leave them out (the count is recorded in {RESULTS_FILENAME})."
    )
