"""``tools/benchmark.py loader``: training-loader throughput (images/s) of a dataset for several worker counts.

The loader is the one training uses (vlprompt.data.build_data_loader) with the CLIP
training transform: random resized crop to 224 (bicubic), flip, normalisation.
``--synthetic DIR`` first writes a DTD-layout dataset of ImageNet-sized JPEGs (500x375) to
DIR (reused if present) and measures on it. Epoch 1 includes starting the worker processes
(what every epoch would cost without persistent workers); later epochs reuse them. Images/s
are per wall-clock second (the workers' CPU time is not the process's). Trailing KEY VALUE
pairs override the config (e.g. INPUT.SIZE "(336, 336)").
"""
import argparse
import contextlib
import io
import os

import torch

from vlprompt_app.benchmarking.measure import clocks
from vlprompt_app.benchmarking.photos import write_dtd_tree
from vlprompt.config import get_cfg_default, merge_from_file, merge_from_list
from vlprompt.data import build_data_loader
from vlprompt.data.datasets import build_dataset
from vlprompt.data.transforms import build_transform
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project_package

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
DTD_CONFIG = str(repository_root() / "configs" / "datasets" / "dtd.yaml")


def build_cfg(args):
    cfg = get_cfg_default()
    merge_from_file(cfg, args.dataset_config_file)
    cfg.DATASET.ROOT = args.root
    cfg.DATASET.NUM_SHOTS = args.shots
    cfg.SEED = 1
    cfg.INPUT.SIZE = (224, 224)
    cfg.INPUT.INTERPOLATION = "bicubic"
    cfg.INPUT.TRANSFORMS = ["random_resized_crop", "random_flip", "normalize"]
    cfg.INPUT.PIXEL_MEAN = CLIP_MEAN
    cfg.INPUT.PIXEL_STD = CLIP_STD
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = args.batch_size
    cfg.VERBOSE = False
    merge_from_list(cfg, args.opts)
    return cfg


def epoch_rates(cfg, train_x, tfm, workers, epochs, max_batches):
    """Images/s (wall clock) of each epoch (at most `max_batches` batches each) of a train
    loader with `workers` workers, and that loader."""
    cfg.DATALOADER.NUM_WORKERS = workers
    loader = build_data_loader(cfg, sampler_type=cfg.DATALOADER.TRAIN_X.SAMPLER, data_source=train_x,
                               batch_size=cfg.DATALOADER.TRAIN_X.BATCH_SIZE, tfm=tfm, is_train=True)
    device = torch.device("cpu")
    rates = []
    for _ in range(epochs):
        images, start = 0, clocks(device)[0]
        for step, batch in enumerate(loader):
            images += batch["img"].shape[0]
            if step + 1 == max_batches:
                break
        rates.append(images / (clocks(device)[0] - start))
    return rates, loader


def add_arguments(parser):
    parser.add_argument("--root", default="", help="DATASET.ROOT (ignored with --synthetic)")
    parser.add_argument("--dataset-config-file", default=DTD_CONFIG, help="default: configs/datasets/dtd.yaml")
    parser.add_argument("--synthetic", metavar="DIR", help="write (or reuse) a synthetic DTD-layout dataset in DIR")
    parser.add_argument("--synthetic-images", type=int, nargs=2, default=(10, 64), metavar=("CLASSES", "PER_CLASS"))
    parser.add_argument("--synthetic-size", type=int, nargs=2, default=(500, 375), metavar=("W", "H"))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4, 8])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--shots", type=int, default=-1, help="DATASET.NUM_SHOTS (default: all images)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-batches", type=int, default=50, help="batches per epoch at most")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")


def measure(args):
    """(settings, one record per worker count: images/s of each epoch, persistent workers, pinned memory)."""
    if args.clock != "wall":
        raise SystemExit("error: the loader benchmark measures images/s on the wall clock only "
                         "(its worker processes' CPU time is not this process's): drop --clock cpu")
    import_project_package("datasets")
    if args.synthetic:
        classes, per_class = args.synthetic_images
        write_dtd_tree(args.synthetic, classes, per_class, tuple(args.synthetic_size))
        args.root, args.dataset_config_file = args.synthetic, DTD_CONFIG
    cfg = build_cfg(args)
    with contextlib.redirect_stdout(io.StringIO()):
        train_x = build_dataset(cfg).train_x
        tfm = build_transform(cfg, is_train=True)
    settings = {"dataset": cfg.DATASET.NAME, "images": len(train_x), "batch_size": args.batch_size,
                "transforms": list(cfg.INPUT.TRANSFORMS), "input_size": list(cfg.INPUT.SIZE),
                "interpolation": cfg.INPUT.INTERPOLATION, "max_batches": args.max_batches, "epochs": args.epochs,
                "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "clock": "wall"}
    records = []
    for workers in args.workers:
        torch.manual_seed(0)
        rates, loader = epoch_rates(cfg, train_x, tfm, workers, args.epochs, args.max_batches)
        records.append({"case": f"{workers} workers", "workers": workers, "images_per_s": rates,
                        "persistent_workers": loader.persistent_workers, "pin_memory": loader.pin_memory})
        del loader
    return settings, records


def table_rows(records):
    return [[str(record["workers"]), *(f"{rate:.1f}" for rate in record["images_per_s"]),
             str(record["persistent_workers"]), str(record["pin_memory"])] for record in records]


def headers(settings):
    """The table's columns: one per epoch."""
    return ["workers", *(f"epoch {epoch + 1} img/s" for epoch in range(settings["epochs"])), "persistent",
            "pin_memory"]


def header_line(settings):
    return (f"Train loader of {settings['dataset']} ({settings['images']:,} images), batch {settings['batch_size']}, "
            f"{'+'.join(settings['transforms'])} at {settings['input_size'][0]}x{settings['input_size'][1]} "
            f"({settings['interpolation']}), at most {settings['max_batches']} batches per epoch; "
            f"{settings['cpu_count']} CPUs, torch threads {settings['threads']}, wall clock")


def summary_lines(report):
    return []
