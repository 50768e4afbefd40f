"""Learning-rate schedulers from ``cfg.OPTIM`` (Dassl ``build_lr_scheduler``) and the
warm-up wrappers.

The engine steps the scheduler once per epoch, after the last optimizer step of the
epoch. A warm-up wrapper (W = WARMUP_EPOCH epochs) sets the warm-up lr for epochs
0..W-1, the base lr at epoch W, and from then on steps its ``successor`` (the inner
scheduler, which keeps driving the live optimizer after a resume).
"""
import torch
from torch.optim.lr_scheduler import LRScheduler

from vlprompt.utils import PickledObject

__all__ = [
    "AVAI_SCHEDS",
    "build_lr_scheduler",
    "ConstantWarmupScheduler",
    "LinearWarmupScheduler",
]

AVAI_SCHEDS = ["single_step", "multi_step", "cosine"]

_PLAIN_SCALARS = (bool, int, float, str, type(None))


def _is_plain(value):
    """True for numbers, strings, None, tensors and lists/tuples/dicts (e.g. Counter) of them."""
    if isinstance(value, (_PLAIN_SCALARS, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_is_plain(key) and _is_plain(item) for key, item in value.items())
    return False


class _BaseWarmupScheduler(LRScheduler):
    """Warm-up for ``warmup_epoch`` steps, then delegate every step to ``successor``.

    Subclasses define ``_warmup_lrs()``, the lrs for ``self.last_epoch < warmup_epoch``.
    """

    def __init__(self, optimizer, successor, warmup_epoch, last_epoch=-1):
        self.successor = successor
        self.warmup_epoch = warmup_epoch
        super().__init__(optimizer, last_epoch)

    def _warmup_lrs(self):
        raise NotImplementedError

    def get_lr(self):
        if self.last_epoch >= self.warmup_epoch:
            return self.successor.get_last_lr()
        return self._warmup_lrs()

    def step(self):
        """Advance one epoch (no epoch argument: stepping is always sequential)."""
        if self.last_epoch >= self.warmup_epoch:
            self.successor.step()
            self._last_lr = self.successor.get_last_lr()
        else:
            super().step()

    def state_dict(self):
        """Own fields plus ``"successor"``: the successor's state dict (never the object)."""
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "successor")}
        state["successor"] = self.successor.state_dict()
        return state

    def load_state_dict(self, state_dict):
        """Load own fields and the successor's state into the live successor.

        Also accepts Dassl's format, where "successor" is a pickled scheduler object (or the
        inert ``PickledObject`` that ``load_checkpoint`` makes of it): its plain fields
        (last_epoch, base_lrs, _last_lr, T_max, ...) are copied.
        """
        state = dict(state_dict)
        if "successor" not in state:
            raise KeyError(f"{type(self).__name__} state has no 'successor' entry; keys: {sorted(state)}")
        successor_state = state.pop("successor")
        if isinstance(successor_state, (LRScheduler, PickledObject)):
            successor_state = self._plain_fields_of(successor_state)
        super().load_state_dict(state)
        self.successor.load_state_dict(successor_state)

    def _plain_fields_of(self, scheduler):
        """The fields of a pickled scheduler that the live successor also has, if plain data."""
        if type(scheduler).__name__ != type(self.successor).__name__:
            raise ValueError(
                f"The checkpoint's scheduler after warm-up is {type(scheduler).__name__}, but the "
                f"configured one is {type(self.successor).__name__} (check OPTIM.LR_SCHEDULER)"
            )
        live_fields = self.successor.state_dict()
        return {
            key: value
            for key, value in vars(scheduler).items()
            if key in live_fields and _is_plain(value)
        }


class ConstantWarmupScheduler(_BaseWarmupScheduler):
    """``cons_lr`` for the first ``warmup_epoch`` epochs, then the successor's schedule."""

    def __init__(self, optimizer, successor, warmup_epoch, cons_lr, last_epoch=-1):
        self.cons_lr = cons_lr
        super().__init__(optimizer, successor, warmup_epoch, last_epoch)

    def _warmup_lrs(self):
        return [self.cons_lr for _ in self.base_lrs]


class LinearWarmupScheduler(_BaseWarmupScheduler):
    """``min_lr`` at epoch 0, ``base * e / warmup_epoch`` for 1 <= e < warmup_epoch,
    then the successor's schedule."""

    def __init__(self, optimizer, successor, warmup_epoch, min_lr, last_epoch=-1):
        self.min_lr = min_lr
        super().__init__(optimizer, successor, warmup_epoch, last_epoch)

    def _warmup_lrs(self):
        if self.last_epoch == 0:
            return [self.min_lr for _ in self.base_lrs]
        return [base_lr * self.last_epoch / self.warmup_epoch for base_lr in self.base_lrs]


def _inner_scheduler(optimizer, optim_cfg):
    """StepLR, MultiStepLR or CosineAnnealingLR as configured by ``optim_cfg``."""
    name = optim_cfg.LR_SCHEDULER
    stepsize = optim_cfg.STEPSIZE
    if name == "single_step":
        if isinstance(stepsize, (list, tuple)):
            stepsize = stepsize[-1]
        if not isinstance(stepsize, int):
            raise TypeError(
                f"OPTIM.STEPSIZE must be an int (or a list/tuple ending in one) for single_step, but got {stepsize!r}"
            )
        if stepsize <= 0:
            stepsize = optim_cfg.MAX_EPOCH
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=stepsize, gamma=optim_cfg.GAMMA)
    if name == "multi_step":
        if not isinstance(stepsize, (list, tuple)):
            raise TypeError(f"OPTIM.STEPSIZE must be a list/tuple of epochs for multi_step, but got {stepsize!r}")
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(stepsize), gamma=optim_cfg.GAMMA)
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=float(optim_cfg.MAX_EPOCH))


def build_lr_scheduler(optimizer, optim_cfg):
    """Build the scheduler named by ``optim_cfg.LR_SCHEDULER``, wrapped in a warm-up
    scheduler when ``WARMUP_EPOCH > 0`` (see the module docstring)."""
    name = optim_cfg.LR_SCHEDULER
    if name not in AVAI_SCHEDS:
        raise ValueError(f"OPTIM.LR_SCHEDULER must be one of {AVAI_SCHEDS}, but got {name!r}")
    scheduler = _inner_scheduler(optimizer, optim_cfg)
    warmup_epoch = optim_cfg.WARMUP_EPOCH
    if warmup_epoch <= 0:
        return scheduler
    if not optim_cfg.WARMUP_RECOUNT:
        scheduler.last_epoch = warmup_epoch
    if optim_cfg.WARMUP_TYPE == "constant":
        return ConstantWarmupScheduler(optimizer, scheduler, warmup_epoch, optim_cfg.WARMUP_CONS_LR)
    if optim_cfg.WARMUP_TYPE == "linear":
        return LinearWarmupScheduler(optimizer, scheduler, warmup_epoch, optim_cfg.WARMUP_MIN_LR)
    raise ValueError(f'OPTIM.WARMUP_TYPE must be "constant" or "linear", but got {optim_cfg.WARMUP_TYPE!r}')
