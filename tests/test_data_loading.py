"""Loader speed settings keep epochs reproducible (persistent workers, seeded items)."""
import os

import numpy as np
import torch
from PIL import Image

from vlprompt.config import get_cfg_default
from vlprompt.data import build_data_loader
from vlprompt.data.datasets import Datum
from vlprompt.data.transforms import build_transform


def _items(tmp_path, n=6):
    """n textured 24x20 JPEGs (a plain colour would hide differences between crops)."""
    items = []
    for i in range(n):
        path = os.path.join(tmp_path, f"{i}.jpg")
        ramp = np.add.outer(np.arange(20) * 9, np.arange(24) * (i + 2)) % 256
        Image.fromarray(np.stack([ramp, 255 - ramp, ramp // 2], axis=-1).astype(np.uint8)).save(path, "JPEG")
        items.append(Datum(path, i % 3))
    return items


def _cfg(workers):
    cfg = get_cfg_default()
    cfg.INPUT.SIZE = (16, 16)
    cfg.INPUT.TRANSFORMS = ["random_resized_crop", "random_flip", "normalize"]
    cfg.DATALOADER.NUM_WORKERS = workers
    return cfg


def _loader(items, workers, is_train=True, sampler="RandomSampler"):
    cfg = _cfg(workers)
    tfm = build_transform(cfg, is_train=is_train)
    return build_data_loader(cfg, sampler, items, batch_size=3, tfm=tfm, is_train=is_train)


def _two_epochs(loader):
    torch.manual_seed(7)
    epochs = []
    for _ in range(2):
        batches = list(loader)
        epochs.append((torch.cat([b["index"] for b in batches]), torch.cat([b["img"] for b in batches])))
    return epochs


def test_worker_epochs_do_not_depend_on_the_number_of_workers(tmp_path):
    items = _items(tmp_path)
    one, two = _two_epochs(_loader(items, 1)), _two_epochs(_loader(items, 2))
    for (order_a, imgs_a), (order_b, imgs_b) in zip(one, two):
        assert torch.equal(order_a, order_b) and torch.equal(imgs_a, imgs_b)
    assert not torch.equal(one[0][1], one[1][1])  # the second epoch augments differently


def test_train_loader_keeps_workers_test_loader_does_not(tmp_path):
    items = _items(tmp_path)
    train = _loader(items, 2)
    test = _loader(items, 2, is_train=False, sampler="SequentialSampler")
    assert train.persistent_workers and not test.persistent_workers
    assert not _loader(items, 0).persistent_workers
    assert train.pin_memory == torch.cuda.is_available()
    batch = next(iter(test))
    assert batch["index"].tolist() == [0, 1, 2] and batch["img"].shape == (3, 3, 16, 16)


def test_fresh_loader_with_restored_rng_state_replays_the_next_epoch(tmp_path):
    """What resuming from a checkpoint does: a new loader (new workers) after torch.set_rng_state."""
    items = _items(tmp_path)
    torch.manual_seed(3)
    running = _loader(items, 2)
    list(running)
    state = torch.get_rng_state()
    second = list(running)

    torch.set_rng_state(state)
    resumed = list(_loader(items, 2))
    for a, b in zip(second, resumed):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["img"], b["img"])
