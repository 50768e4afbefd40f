"""Epoch time of a frozen-image-encoder trainer with and without the feature cache.

    python tools/benchmark_feature_cache.py                       # RAda, ViT-B/16 (random weights)
    python tools/benchmark_feature_cache.py --trainer CLIPAdapter --batch-size 32 --epochs 3
    python tools/benchmark_feature_cache.py --backbone configs/clip/X.json --weights X.pt --image-size 32

Both runs train the same trainer from the same seed on a miniature OxfordPets tree of
ImageNet-sized JPEGs (written to --out). The uncached run encodes every view in the training
step; the cached run first encodes all views of all epochs in batches of
FEATURE_CACHE.BATCH_SIZE (the one-off "fill", a fresh cache directory each time) and then
trains on features. Printed: seconds per epoch (mean over epochs), the fill time, the
per-epoch speed-up and the whole-run speed-up (fill included). Trailing KEY VALUE pairs
override the config (e.g. DATALOADER.NUM_WORKERS 4).
"""
import argparse
import contextlib
import io
import os
import shutil
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import datasets  # noqa: E402,F401  (registers the dataset classes)
import trainers  # noqa: E402,F401  (registers the trainers and their config nodes)
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list  # noqa: E402
from vlprompt.engine import build_trainer  # noqa: E402
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree  # noqa: E402
from vlprompt.utils import set_random_seed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"RAda": "configs/trainers/RAda/vit_b16_base2new.yaml", "CLIPAdapter": "configs/trainers/CLIPAdapter/vit_b16.yaml",
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
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/datasets/oxford_pets.yaml"))
    merge_from_file(cfg, os.path.join(ROOT, CONFIGS[args.trainer]))
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


def time_training(trainer):
    """(seconds of before_train (the cache fill when cached), [seconds of each epoch])."""
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        trainer.before_train()
        setup = time.perf_counter() - start
        epochs = []
        for trainer.epoch in range(trainer.start_epoch, trainer.max_epoch):
            start = time.perf_counter()
            trainer.run_epoch()
            epochs.append(time.perf_counter() - start)
    return setup, epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    args = parser.parse_args()
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
        results[cached] = time_training(trainer)
    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    images = len(trainer.dm.dataset.train_x)
    fill, cached_epochs = results[True]
    uncached_epochs = results[False][1]
    per_epoch = (np.mean(uncached_epochs), np.mean(cached_epochs))
    print(f"{args.trainer} on {args.backbone} ({args.weights} weights), {images} training images, "
          f"batch {args.batch_size}, {args.epochs} epochs, {args.image_size}px, device {device}")
    print(f"uncached epoch: {per_epoch[0]:.3f} s")
    print(f"cache fill:     {fill:.3f} s (all {args.epochs} epochs of views)")
    print(f"cached epoch:   {per_epoch[1]:.4f} s")
    print(f"speed-up per epoch: {per_epoch[0] / per_epoch[1]:.1f}x; whole run incl. fill: "
          f"{sum(uncached_epochs) / (fill + sum(cached_epochs)):.2f}x")


if __name__ == "__main__":
    main()
