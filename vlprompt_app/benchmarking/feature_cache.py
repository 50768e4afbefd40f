"""``tools/benchmark.py feature-cache``: epoch time of a frozen-encoder trainer with and without
the feature cache.

Both runs train the same trainer from the same seed on a miniature OxfordPets tree of
ImageNet-sized JPEGs (written to ``--out``). The uncached run encodes every view in the
training step; the cached run first encodes all views of all epochs in batches of
FEATURE_CACHE.BATCH_SIZE (the one-off "fill", a fresh cache directory each time) and then
trains on features. Rows: the uncached epoch, the fill and the cached epoch (epochs: mean
over epochs); under them the per-epoch speed-up and the whole-run speed-up (fill included).
Trailing KEY VALUE pairs override the config (e.g. DATALOADER.NUM_WORKERS 4).
"""
import argparse
import contextlib
import io
import os
import shutil

import numpy as np
import torch
from PIL import Image

from vlprompt_app.benchmarking.measure import clocks
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import build_trainer
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import set_random_seed

CONFIGS = {"RAda": "configs/trainers/RAda/vit_b16_base2new.yaml",
           "CLIPAdapter": "configs/trainers/CLIPAdapter/vit_b16.yaml",
           "RAdaAdapter": "configs/trainers/RAdaAdapter/vit_b16_base2new.yaml"}


def write_dataset(root, classes, per_class, seed=0):
    """Miniature OxfordPets tree whose images are 500x375 JPEGs (decode cost of real photos)."""
    dataset_dir = write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:classes], train=per_class, val=1,
                                         test=2)
    rng = np.random.default_rng(seed)
    image_dir = os.path.join(dataset_dir, "images")
    for name in os.listdir(image_dir):
        coarse = Image.open(os.path.join(image_dir, name)).convert("RGB").resize((500, 375), Image.BICUBIC)
        pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (375, 500, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(image_dir, name), quality=90)


def build(args, data_root, output_dir, cached):
    root = repository_root()
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, str(root / "configs" / "datasets" / "oxford_pets.yaml"))
    merge_from_file(cfg, str(root / CONFIGS[args.trainer]))
    cfg.TRAINER.NAME, cfg.DATASET.ROOT, cfg.OUTPUT_DIR = args.trainer, data_root, output_dir
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = args.backbone, args.weights
    cfg.INPUT.SIZE = (args.image_size, args.image_size)
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE, cfg.DATALOADER.NUM_WORKERS = args.batch_size, 0
    cfg.OPTIM.MAX_EPOCH, cfg.SEED, cfg.VERBOSE = args.epochs, 1, False
    cfg.FEATURE_CACHE.ENABLED = cached
    cfg.FEATURE_CACHE.DIR = os.path.join(output_dir, "feature_cache")
    merge_from_list(cfg, args.opts)
    cfg.freeze()
    set_random_seed(cfg.SEED)
    with contextlib.redirect_stdout(io.StringIO()):
        return build_trainer(cfg)


def time_training(trainer, device):
    """((wall, CPU) seconds of before_train (the cache fill when cached), [(wall, CPU) of each epoch])."""
    def elapsed(start):
        end = clocks(device)
        return end[0] - start[0], end[1] - start[1]

    with contextlib.redirect_stdout(io.StringIO()):
        start = clocks(device)
        trainer.before_train()
        setup = elapsed(start)
        epochs = []
        for trainer.epoch in range(trainer.start_epoch, trainer.max_epoch):
            start = clocks(device)
            trainer.run_epoch()
            epochs.append(elapsed(start))
    return setup, epochs


def add_arguments(parser):
    parser.add_argument("--trainer", default="RAda", choices=sorted(CONFIGS))
    parser.add_argument("--backbone", default="ViT-B/16")
    parser.add_argument("--weights", default="random", help='"random", a pretrained tag or a weights file')
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--per-class", type=int, default=8, help="training images per class")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default="output/benchmark_feature_cache")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")


def measure(args):
    """(settings, records "uncached epoch", "cache fill", "cached epoch"): seconds on both
    clocks (epochs: mean over epochs), ``s`` on the chosen clock."""
    import_project()
    if args.threads:
        torch.set_num_threads(args.threads)
    data_root = os.path.join(args.out, "data")
    if not os.path.isdir(os.path.join(data_root, "oxford_pets")):
        write_dataset(data_root, args.classes, args.per_class)
    results = {}
    for cached in (False, True):
        run_dir = os.path.join(args.out, "cached" if cached else "uncached")
        shutil.rmtree(run_dir, ignore_errors=True)
        trainer = build(args, data_root, run_dir, cached)
        results[cached] = time_training(trainer, trainer.device)
    settings = {key: getattr(args, key) for key in ("trainer", "backbone", "weights", "image_size", "batch_size",
                                                    "epochs", "clock", "opts")}
    settings.update(images=len(trainer.dm.dataset.train_x), device=str(trainer.device),
                    threads=torch.get_num_threads())
    fill, cached_epochs = results[True]
    uncached_epochs = results[False][1]
    clock = 0 if args.clock == "wall" else 1

    def record(case, spans, count):
        return {"case": case, "s": float(np.mean([span[clock] for span in spans])), "count": count,
                "wall_s": float(np.mean([span[0] for span in spans])),
                "cpu_s": float(np.mean([span[1] for span in spans])),
                "total_s": float(sum(span[clock] for span in spans))}

    return settings, [record("uncached epoch", uncached_epochs, len(uncached_epochs)), record("cache fill", [fill], 1),
                      record("cached epoch", cached_epochs, len(cached_epochs))]


HEADERS = ["case", "s", "wall s", "CPU s", "count"]


def table_rows(records):
    return [[record["case"], f"{record['s']:.4f}", f"{record['wall_s']:.4f}", f"{record['cpu_s']:.4f}",
             str(record["count"])] for record in records]


def header_line(settings):
    return (f"{settings['trainer']} on {settings['backbone']} ({settings['weights']} weights), "
            f"{settings['images']} training images, batch {settings['batch_size']}, {settings['epochs']} epochs, "
            f"{settings['image_size']}px, "
            f"device {settings['device']} ({settings['threads']} threads), {settings['clock']} clock")


def summary_lines(report):
    """Speed-up per epoch, and over the whole run with the fill."""
    record = {record["case"]: record for record in report["results"]}
    uncached, fill, cached = record["uncached epoch"], record["cache fill"], record["cached epoch"]
    return [f"speed-up per epoch: {uncached['s'] / cached['s']:.1f}x; whole run incl. fill: "
            f"{uncached['total_s'] / (fill['total_s'] + cached['total_s']):.2f}x"]
