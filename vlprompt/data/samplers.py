"""Samplers by name (Dassl's). Only RandomSampler and SequentialSampler are provided.

Both are resumable: ``state_dict()`` describes the epoch being iterated (for the random
sampler, the seed it drew), and ``resume_epoch(state, skip)`` makes the next iteration replay
that epoch from position ``skip`` without drawing anything, so a run resumed from a mid-epoch
checkpoint sees the same remaining samples in the same order.
"""
import torch
from torch.utils.data import RandomSampler, SequentialSampler

__all__ = [
    "SAMPLERS",
    "ResumableRandomSampler",
    "ResumableSequentialSampler",
    "build_sampler",
]

SAMPLERS = ("RandomSampler", "SequentialSampler")
DASSL_SAMPLERS_NOT_PROVIDED = ("RandomDomainSampler", "SeqDomainSampler", "RandomClassSampler")


class SeededEpochs:
    """Mid-epoch resumability for a sampler whose epoch order is a function of one seed.

    ``epoch_generator()`` draws one 64-bit seed from torch's global generator (or, after
    ``resume_epoch``, takes the checkpoint's without drawing) and returns a generator seeded with
    it and the number of positions to skip. ``epoch_seed`` is the seed of the epoch being (or
    last) iterated.
    """

    epoch_seed = None
    _resume = None

    def epoch_generator(self):
        """(torch.Generator seeded with this epoch's seed, positions already run)."""
        if self._resume is not None:
            (state, skip), self._resume = self._resume, None
            seed = state["seed"]
        else:
            seed, skip = int(torch.empty((), dtype=torch.int64).random_().item()), 0
        self.epoch_seed = seed
        return torch.Generator().manual_seed(seed), skip

    def state_dict(self):
        """{"seed": the current epoch's seed} (plain ints, for checkpoints)."""
        return {"seed": self.epoch_seed}

    def resume_epoch(self, state, skip):
        """Make the next iteration replay the epoch of ``state`` from position ``skip``, drawing nothing."""
        self._resume = (state, skip)


class ResumableRandomSampler(SeededEpochs, RandomSampler):
    """torch's RandomSampler (without replacement, global generator), resumable mid-epoch.

    Each epoch draws one 64-bit seed from torch's global generator when iteration starts and
    yields ``torch.randperm(N)`` of a generator seeded with it: the draws and the order of
    torch's RandomSampler, so seeded runs keep Dassl's order.
    """

    def __iter__(self):
        generator, skip = self.epoch_generator()
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()[skip:]


class ResumableSequentialSampler(SequentialSampler):
    """torch's SequentialSampler (list order), resumable mid-epoch (it has no random state)."""

    def __init__(self, data_source):
        super().__init__(data_source)
        self._skip = 0

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return iter(range(skip, len(self.data_source)))

    def state_dict(self):
        return {}

    def resume_epoch(self, state, skip):
        """Make the next iteration start at position ``skip``."""
        self._skip = skip


def build_sampler(sampler_type, cfg=None, data_source=None, batch_size=32, n_domain=0, n_ins=16):
    """Return a resumable torch sampler over `data_source`.

    "RandomSampler" shuffles without replacement, drawing its seed from torch's
    global generator at the start of every epoch; "SequentialSampler" keeps the
    list order. `cfg`, `batch_size`, `n_domain` and `n_ins` are accepted for
    Dassl's signature (its domain/class samplers use them).

    Raises:
        NotImplementedError: one of Dassl's domain/class samplers is requested.
        ValueError: the name is unknown.
    """
    if sampler_type == "RandomSampler":
        return ResumableRandomSampler(data_source)
    if sampler_type == "SequentialSampler":
        return ResumableSequentialSampler(data_source)
    if sampler_type in DASSL_SAMPLERS_NOT_PROVIDED:
        raise NotImplementedError(
            f"Sampler {sampler_type} (a Dassl domain/class sampler) is not implemented in vlprompt; "
            f"DATALOADER.*.SAMPLER must be one of {list(SAMPLERS)}."
        )
    raise ValueError(f"Unknown sampler type: {sampler_type} (expected one of {list(SAMPLERS)})")
