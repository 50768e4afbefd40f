"""Samplers by name (engine.md §4.6). Only RandomSampler and SequentialSampler are provided."""
from torch.utils.data import RandomSampler, SequentialSampler

SAMPLERS = ("RandomSampler", "SequentialSampler")
DASSL_SAMPLERS_NOT_PROVIDED = ("RandomDomainSampler", "SeqDomainSampler", "RandomClassSampler")


def build_sampler(sampler_type, cfg=None, data_source=None, batch_size=32, n_domain=0, n_ins=16):
    """Return a torch sampler over `data_source`.

    "RandomSampler" shuffles without replacement, drawing its seed from torch's
    global generator at the start of every epoch; "SequentialSampler" keeps the
    list order. `cfg`, `batch_size`, `n_domain` and `n_ins` are accepted for
    Dassl's signature (its domain/class samplers use them).

    Raises:
        NotImplementedError: one of Dassl's domain/class samplers is requested.
        ValueError: the name is unknown.
    """
    if sampler_type == "RandomSampler":
        return RandomSampler(data_source)
    if sampler_type == "SequentialSampler":
        return SequentialSampler(data_source)
    if sampler_type in DASSL_SAMPLERS_NOT_PROVIDED:
        raise NotImplementedError(
            f"Sampler {sampler_type} (a Dassl domain/class sampler) is not implemented in vlprompt; "
            f"DATALOADER.*.SAMPLER must be one of {list(SAMPLERS)}."
        )
    raise ValueError(f"Unknown sampler type: {sampler_type} (expected one of {list(SAMPLERS)})")
