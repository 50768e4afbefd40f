"""The toy image set of the engine and reliability tests, and stdout capture.

DATASET.ROOT/c<label>/<split><i>.jpg: 3 classes of 12x12 JPEGs, one base colour per class
plus Gaussian noise; train 5, val 1, test 2 images per class.
"""
import contextlib
import io
import os.path as osp

import numpy as np
from PIL import Image

from vlprompt.data.datasets import DatasetBase, Datum

NUM_CLASSES = 3
SPLIT_SIZES = {"train": 5, "val": 1, "test": 2}  # images per class


def write_toy_images(root):
    """Write the toy JPEGs under the existing folder ``root`` (a pathlib.Path); returns ``root``."""
    rng = np.random.default_rng(0)
    for label in range(NUM_CLASSES):
        (root / f"c{label}").mkdir()
        base = np.zeros(3)
        base[label] = 200.0
        for split, count in SPLIT_SIZES.items():
            for i in range(count):
                pixels = np.clip(base + rng.normal(0, 40, size=(12, 12, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / f"c{label}" / f"{split}{i}.jpg")
    return root


class ToyColourDataset(DatasetBase):
    """The toy images under DATASET.ROOT, labelled by class folder ("class<label>"); register a subclass to use it."""

    def __init__(self, cfg):
        def items(split):
            return [
                Datum(impath=osp.join(cfg.DATASET.ROOT, f"c{label}", f"{split}{i}.jpg"), label=label,
                      classname=f"class{label}")
                for label in range(NUM_CLASSES)
                for i in range(SPLIT_SIZES[split])
            ]

        super().__init__(train_x=items("train"), val=items("val"), test=items("test"))


def quietly(function):
    """(return value of ``function()``, its stdout as a list of lines)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        value = function()
    return value, buffer.getvalue().splitlines()
