"""File, JSON, image, seeding and name-matching helpers (Dassl ``utils.tools`` names).

Every writer in the package goes through :func:`atomic_write` (from :mod:`vlprompt.fileio`,
re-exported here), so an interrupted run never leaves a half-written file under its final name.
"""
import difflib
import json
import os
import os.path as osp
import random
import warnings

import numpy as np
import torch
from PIL import Image

from vlprompt.fileio import WriteFailedError, atomic_write, file_sha256, mkdir_if_missing, save_figure, write_text

__all__ = [
    "CorruptFileError",
    "WriteFailedError",
    "mkdir_if_missing",
    "check_isfile",
    "atomic_write",
    "file_sha256",
    "read_json",
    "write_json",
    "write_text",
    "save_figure",
    "read_image",
    "listdir_nohidden",
    "get_most_similar_str_to_a_from_b",
    "check_availability",
    "tolist_if_not",
    "set_random_seed",
]


def check_isfile(fpath):
    """Return True if ``fpath`` is an existing file; otherwise warn 'No file found at "PATH"' and return False."""
    isfile = osp.isfile(fpath)
    if not isfile:
        warnings.warn(f'No file found at "{fpath}"')
    return isfile


class CorruptFileError(ValueError):
    """A file exists but cannot be decoded (truncated by an interrupted copy, or damaged)."""


def read_json(fpath):
    """Read a JSON file and return the decoded object.

    Raises:
        CorruptFileError: the file is not valid JSON (the message names it and the position).
    """
    with open(fpath, "r", encoding="utf-8") as f:
        try:
            return json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CorruptFileError(
                f'"{fpath}" is not valid JSON ({error}); it may be truncated or damaged (e.g. by an interrupted '
                "copy). Delete it if it is a cache or a split file vlprompt wrote; it will be written again."
            ) from None


def write_json(obj, fpath):
    """Write ``obj`` to ``fpath`` as JSON (4-space indent, Dassl's separators), atomically.

    Parent folders are created.
    """
    with atomic_write(fpath, "w") as f:
        json.dump(obj, f, indent=4, separators=(",", ": "))


def read_image(path):
    """Read an image file with PIL and return it converted to RGB.

    Raises:
        FileNotFoundError: the file does not exist.
        OSError: the file exists but cannot be decoded as an image.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'No file found at "{path}"')
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except OSError as error:
        raise OSError(
            f'Unable to read image "{path}" ({error}); the file may be truncated or not an image'
        ) from error


def listdir_nohidden(path, sort=False):
    """Names in ``path`` that do not start with "." (directory-listing order unless ``sort``)."""
    items = [name for name in os.listdir(path) if not name.startswith(".")]
    if sort:
        items.sort()
    return items


def get_most_similar_str_to_a_from_b(a, b):
    """Return the string in ``b`` with the highest difflib ratio to ``a`` (first one on ties).

    Returns "" when ``b`` is empty.
    """
    best, best_ratio = "", 0.0
    for candidate in b:
        ratio = difflib.SequenceMatcher(None, a, candidate).ratio()
        if ratio > best_ratio:
            best, best_ratio = candidate, ratio
    return best


def check_availability(requested, available):
    """Raise ValueError unless ``requested`` is one of ``available`` (a list of names).

    The message lists every available name and the most similar one to ``requested``.
    """
    if requested in available:
        return
    available = list(available)
    if not available:
        raise ValueError(
            f"The requested one is expected to belong to {available}, but got [{requested}] "
            "(nothing is available: was the module that registers the names imported?)"
        )
    suggestion = get_most_similar_str_to_a_from_b(requested, available)
    raise ValueError(
        f"The requested one is expected to belong to {available}, but got [{requested}] "
        f"(do you mean [{suggestion}]?)"
    )


def tolist_if_not(x):
    """Wrap ``x`` in a list unless it already is one."""
    if not isinstance(x, list):
        x = [x]
    return x


def set_random_seed(seed):
    """Seed Python ``random``, NumPy, torch (CPU) and every CUDA device with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
