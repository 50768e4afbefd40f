"""Photo-sized synthetic JPEG trees for throughput measurements (numpy and Pillow only, no torch).

An image is a smooth random colour field (a 16x12 grid of random colours, bicubic-resized to
the photo's size) plus fine uniform noise of +-12 levels, saved as JPEG quality 90: at 500x375
about 55 KB, so file sizes and decode costs are close to ImageNet photos (mean about 110 KB at
about 400x350; the decode cost grows with the pixels, not the content).

* :func:`write_dtd_tree`: the loader benchmark's DTD layout (``tools/benchmark.py loader
  --synthetic``), every image in the train split.
* :func:`write_imagenet_tree`: the ImageNet layout that ``datasets/imagenet.py`` reads
  (``imagenet/images/{train,val}/<WNID>/*.JPEG`` and ``classnames.txt``), class by class in
  parallel processes; the GPU acceptance run's data stage trains from it.
"""
import json
import os
import shutil
import time
from multiprocessing import Pool

import numpy as np
from PIL import Image

from vlprompt.fileio import atomic_write

QUALITY = 90
COMPLETE = ".complete"  # written last into a finished ImageNet tree: {"classes", "train", "val", "size"}


def draw_photo(rng, size):
    """A PIL RGB image of ``size`` (width, height) from ``rng`` (a numpy Generator; see the module docstring)."""
    width, height = size
    coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def write_dtd_tree(root, classes=10, per_class=64, size=(500, 375), seed=0):
    """Write ``root/dtd/`` (images/<class>/<class>_NNNN.jpg and the split JSON, every image in
    train) unless its split file is there."""
    base = os.path.join(root, "dtd")
    split_path = os.path.join(base, "split_zhou_DescribableTextures.json")
    if os.path.isfile(split_path):
        return
    rng = np.random.default_rng(seed)
    train = []
    for label in range(classes):
        name = f"class{label:02d}"
        os.makedirs(os.path.join(base, "images", name), exist_ok=True)
        for i in range(per_class):
            relative = f"{name}/{name}_{i:04d}.jpg"
            draw_photo(rng, size).save(os.path.join(base, "images", relative), quality=QUALITY)
            train.append([relative, label, name])
    with open(split_path, "w") as f:
        json.dump({"train": train, "val": train[:1], "test": train[:1]}, f)


def wnid(label):
    """The stand-in WordNet id of class ``label`` (sorted like the labels)."""
    return f"n{label:08d}"


def class_name(label):
    """The class name of ``label``: "class number <label>", as the per-trainer benchmark names classes."""
    return f"class number {label}"


def _write_class(job):
    """Write one class's train and val images (a Pool task); returns the bytes written."""
    images_dir, label, train, val, size, seed = job
    written = 0
    for split, count in (("train", train), ("val", val)):
        folder = os.path.join(images_dir, split, wnid(label))
        os.makedirs(folder)
        for n in range(count):
            rng = np.random.default_rng([seed, label, 0 if split == "train" else 1, n])
            path = os.path.join(folder, f"{wnid(label)}_{n:05d}.JPEG")
            draw_photo(rng, size).save(path, quality=QUALITY)
            written += os.path.getsize(path)
    return written


def write_imagenet_tree(root, classes, train_per_class, val_per_class, size=(500, 375), seed=0, processes=None):
    """Write ``root/imagenet/`` in the ImageNet layout, or reuse it when a finished tree of the same
    shape is there.

    Args:
        root: the datasets folder (``DATASET.ROOT``).
        classes: class folders (WNIDs ``n00000000`` ...; names "class number i").
        train_per_class, val_per_class: images per class folder of images/train and images/val.
        size: (width, height) of every image.
        seed: image n of class c in split s is drawn from ``default_rng([seed, c, s, n])``, so a
            tree is the same whatever the process count.
        processes: parallel writers (default: the CPU count).

    Returns:
        {"classes", "train", "val", "size", "images", "bytes", "seconds", "processes", "reused"}.
    """
    base = os.path.join(root, "imagenet")
    shape = {"classes": classes, "train": train_per_class, "val": val_per_class, "size": list(size)}
    marker = os.path.join(base, COMPLETE)
    if os.path.isfile(marker):
        with open(marker, encoding="utf-8") as f:
            done = json.load(f)
        if {key: done[key] for key in shape} == shape:
            return dict(done, reused=True)
    shutil.rmtree(base, ignore_errors=True)
    staging = f"{base}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    processes = processes or os.cpu_count()
    start = time.perf_counter()
    jobs = [(os.path.join(staging, "images"), label, train_per_class, val_per_class, tuple(size), seed)
            for label in range(classes)]
    try:
        with Pool(processes) as pool:
            written = sum(pool.imap_unordered(_write_class, jobs, chunksize=max(1, classes // (4 * processes))))
        with open(os.path.join(staging, "classnames.txt"), "w", encoding="utf-8") as f:
            f.writelines(f"{wnid(label)} {class_name(label)}\n" for label in range(classes))
        os.rename(staging, base)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    summary = dict(shape, images=classes * (train_per_class + val_per_class), bytes=written,
                   seconds=time.perf_counter() - start, processes=processes)
    with atomic_write(marker, "w") as f:
        json.dump(summary, f)
    return dict(summary, reused=False)
