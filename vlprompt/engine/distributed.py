"""Data-parallel training under ``torchrun`` (DistributedDataParallel).

``torchrun --nproc_per_node N train.py ...`` starts N processes and sets RANK, WORLD_SIZE and
LOCAL_RANK. A trainer that supports it sets the class attribute ``supports_distributed =
True`` and calls :func:`init_distributed` before building anything: with those variables it
joins the process group (NCCL on CUDA, Gloo on CPU) and binds the process to GPU LOCAL_RANK;
without them it returns None and the trainer runs as a single process, unchanged. Each
process then trains on its own shard of every epoch (:func:`distributed_train_loader`),
gradients are averaged by DistributedDataParallel, the logged loss terms are averaged over
the processes (:func:`mean_over_processes`), and only the main process (rank 0) writes
checkpoints, results and tensorboard scalars; log files of the other ranks are
``log-rank<R>.txt`` (see :func:`vlprompt.utils.setup_logger`). ``build_trainer`` refuses
(:func:`check_world_size`) to start several processes of a trainer without that attribute,
which would each train their own copy into the same folder.
"""
import os
import random
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch.utils.data import DataLoader, DistributedSampler

from vlprompt.config import ConfigError
from vlprompt.data.data_manager import SeededItems

__all__ = [
    "DistributedContext", "init_distributed", "is_main_process", "world_size_from_env", "check_world_size",
    "distributed_train_loader", "dataset_wrapper", "item_seeded_loader", "epoch_seed",
    "ItemSeededDistributedSampler", "RestoringSeededItems",
    "mean_over_processes", "all_gather_rows",
]


@dataclass
class DistributedContext:
    """Where this process stands in the ``torchrun`` job."""

    rank: int
    world_size: int
    local_rank: int


def init_distributed(use_cuda=True) -> Optional[DistributedContext]:
    """Join the process group described by the environment (None when not under torchrun).

    Args:
        use_cuda: use CUDA (NCCL, one GPU per process) when available; else Gloo on the CPU.
    """
    if "WORLD_SIZE" not in os.environ:
        return None
    context = DistributedContext(
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )
    if not dist.is_initialized():
        cuda = use_cuda and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(context.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    return context


def is_main_process():
    """True outside a process group and on rank 0."""
    return not dist.is_initialized() or dist.get_rank() == 0


def world_size_from_env() -> int:
    """The number of processes torchrun started (WORLD_SIZE), 1 when not under torchrun."""
    return int(os.environ.get("WORLD_SIZE", 1))


def check_world_size(trainer_name, registry, world_size=None):
    """Refuse to run a trainer without DDP support as several processes.

    Args:
        trainer_name: a name registered in ``registry`` (the trainer registry).
        world_size: the number of processes (default: :func:`world_size_from_env`).

    Raises:
        ConfigError: ``world_size`` > 1 and the trainer's class does not set
            ``supports_distributed = True``; the message names the trainers that do.
    """
    world = world_size_from_env() if world_size is None else world_size
    if world <= 1 or getattr(registry.get(trainer_name), "supports_distributed", False):
        return
    supported = sorted(name for name in registry.registered_names()
                       if getattr(registry.get(name), "supports_distributed", False))
    raise ConfigError(
        f"Trainer '{trainer_name}' runs as one process, but {world} processes were asked for (torchrun "
        f"--nproc_per_node / run_protocol.py --nproc-per-node): each would train its own copy into the same "
        f"output folder. Start it as one process; DistributedDataParallel is supported by: "
        f"{', '.join(supported) or 'no registered trainer'}."
    )


def distributed_train_loader(loader, context, batch_size, seed, shuffle=True):
    """This process's shard of a training loader built by ``build_data_loader``.

    A DistributedSampler orders the items (shuffled with (seed, epoch), or in dataset order
    when ``shuffle`` is False) and gives process r the items r, r + N, r + 2N, ... of that
    order (N = world size), so global step i is made of items [i*N*b, (i+1)*N*b) of the order
    (b = ``batch_size``): with ``shuffle`` False, exactly the batch of step i of one process
    with batch N*b and a SequentialSampler. The last incomplete global batch is dropped. Call
    ``loader.sampler.set_epoch(epoch)`` before each epoch.

    Augmentation: item i of epoch e is read with torch, ``random`` and NumPy seeded from
    (seed, e, i), whichever process or worker reads it, and the generators are restored
    afterwards. So the N processes do not repeat each other's random crops (each would
    otherwise draw the same stream from its identically seeded generator), and an epoch's
    images do not depend on N or on DATALOADER.NUM_WORKERS.

    Args:
        loader: the single-process training loader (its DatasetWrapper is reused).
        context: DistributedContext.
        batch_size: images per process and step (the global batch divided by the world size).
        seed: shuffling and augmentation seed (the same on every process).
        shuffle: False for DATALOADER.TRAIN_X.SAMPLER "SequentialSampler".
    """
    dataset = dataset_wrapper(loader)
    sampler = ItemSeededDistributedSampler(
        dataset, num_replicas=context.world_size, rank=context.rank, shuffle=shuffle, seed=seed,
        drop_last=True,
    )
    return item_seeded_loader(dataset, sampler, batch_size, loader)


def dataset_wrapper(loader):
    """The DatasetWrapper (image reading and transform) of a loader built by ``build_data_loader``."""
    dataset = loader.dataset
    while not hasattr(dataset, "data_source"):  # the worker-seeding wrapper of build_data_loader
        dataset = dataset.dataset
    return dataset


def item_seeded_loader(dataset, sampler, batch_size, loader):
    """A DataLoader of ``dataset`` whose ``sampler`` yields (index, item seed) pairs, each item read
    by :class:`RestoringSeededItems`; workers and pinning as ``loader``; the last incomplete batch
    dropped."""
    workers = loader.num_workers
    return DataLoader(  # its per-iterator seed from a private generator: items carry their own seeds
        RestoringSeededItems(dataset), batch_size=batch_size, sampler=sampler, num_workers=workers,
        drop_last=True, pin_memory=loader.pin_memory, persistent_workers=workers > 0, generator=torch.Generator(),
    )


def epoch_seed(seed, epoch):
    """h(seed, epoch): a 64-bit hash of the pair, the same on every process."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0])


class ItemSeededDistributedSampler(DistributedSampler):
    """A DistributedSampler that yields (index, item seed) pairs for :class:`RestoringSeededItems`.

    The seed of item i in epoch e is (h(seed, e) + i) mod 2**63 (:func:`epoch_seed`): the same
    on every process, different for every item of the epoch and from epoch to epoch.
    """

    def __iter__(self):
        seed = epoch_seed(self.seed, self.epoch)
        for index in super().__iter__():
            yield index, (seed + index) % 2**63


class RestoringSeededItems(SeededItems):
    """SeededItems that puts torch's, ``random``'s and NumPy's global generators back after each
    item: with DATALOADER.NUM_WORKERS 0 items are read in the training process, whose
    generators must not depend on the data."""

    def __getitem__(self, key):
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            return super().__getitem__(key)
        finally:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])


def mean_over_processes(summary, device):
    """The step's summary averaged over the processes (unchanged outside a group).

    Every process holds the means over its own equal-sized shard of the global batch, so their
    average is the mean over the global batch: the logged loss and accuracy are the same as
    one process with the global batch would log. The averages stay on ``device`` (float64 0-dim
    tensors, read when logged): averaging them does not make the step wait.

    Args:
        summary: {name: float or one-element tensor}, the same names on every process.
        device: this process's device (NCCL reduces CUDA tensors only).
    """
    if not dist.is_initialized():
        return summary
    names = list(summary)  # the same order on every process (built by the same code)
    values = torch.stack([torch.as_tensor(summary[name], dtype=torch.float64, device=device).detach().reshape(())
                          for name in names])
    dist.all_reduce(values)
    values /= dist.get_world_size()
    return dict(zip(names, values.unbind()))


def all_gather_rows(tensor):
    """The processes' ``tensor`` [b, ...] concatenated in rank order, [W·b, ...] (unchanged
    outside a process group), differentiable: the gradient of every process's loss with respect
    to rows r·b..(r+1)·b - 1 is summed and sent back to process r
    (``torch.distributed.nn.functional.all_gather``). So when every process computes the same
    loss of the gathered rows, process r's parameters receive W times the gradient through its own
    rows, and DistributedDataParallel's average over the W processes gives each parameter the
    gradient of one process holding the whole batch.
    """
    if not dist.is_initialized():
        return tensor
    return torch.cat(dist_nn.all_gather(tensor), dim=0)
