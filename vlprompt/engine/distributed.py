"""Data-parallel training under ``torchrun`` (DistributedDataParallel).

``torchrun --nproc_per_node N train.py ...`` starts N processes and sets RANK, WORLD_SIZE and
LOCAL_RANK. A trainer that supports it calls :func:`init_distributed` before building
anything: with those variables it joins the process group (NCCL on CUDA, Gloo on CPU) and
binds the process to GPU LOCAL_RANK; without them it returns None and the trainer runs as a
single process, unchanged. Each process then trains on its own shard of every epoch
(:func:`distributed_train_loader`), gradients are averaged by DistributedDataParallel, and
only the main process (rank 0) writes checkpoints and results; log files of the other ranks
are ``log-rank<R>.txt`` (see :func:`vlprompt.utils.setup_logger`).
"""
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

__all__ = ["DistributedContext", "init_distributed", "is_main_process", "distributed_train_loader"]


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


def distributed_train_loader(loader, context, batch_size, seed):
    """This process's shard of a training loader built by ``build_data_loader``.

    Each epoch, a DistributedSampler shuffles the items with (seed, epoch) and gives every
    process ``len / world_size`` of them (the last incomplete global batch is dropped); call
    ``loader.sampler.set_epoch(epoch)`` before each epoch.

    Args:
        loader: the single-process training loader (its DatasetWrapper is reused).
        context: DistributedContext.
        batch_size: images per process and step.
        seed: shuffling seed (the same on every process).
    """
    dataset = loader.dataset
    while not hasattr(dataset, "data_source"):  # the worker-seeding wrapper of build_data_loader
        dataset = dataset.dataset
    sampler = DistributedSampler(
        dataset, num_replicas=context.world_size, rank=context.rank, shuffle=True, seed=seed, drop_last=True
    )
    workers = loader.num_workers
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=True,
        pin_memory=loader.pin_memory, persistent_workers=workers > 0,
    )
