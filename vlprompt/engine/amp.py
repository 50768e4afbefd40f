"""Device-aware mixed precision for trainers: autocast for forward passes plus a GradScaler.

Decision: the precision a trainer asks for is
``cfg.TRAINER.<TRAINER.NAME upper-cased>.PREC`` when that key exists, else "fp32".

| requested | on CUDA, or on the CPU with TRAIN.CPU_AUTOCAST   | on the CPU otherwise |
|-----------|--------------------------------------------------|----------------------|
| fp32      | nothing                                          | fp32                 |
| fp16, amp | fp16 autocast, fp32 master weights, a GradScaler | fp32                 |
| bf16      | bf16 autocast, no scaler                         | fp32                 |

On the CPU, half-precision autocast is slow and only useful to check a trainer's mixed
precision without a GPU, so it is opt-in (``TRAIN.CPU_AUTOCAST``). Autocast and the scaler are
made for the trainer's device type (``torch.autocast(device.type)``, ``GradScaler(device.type)``).
Only ``torch.amp`` is used (``torch.cuda.amp`` is deprecated).
"""
import contextlib
from typing import Iterable, Optional

import torch

PRECISIONS = ("fp32", "fp16", "amp", "bf16")

_AUTOCAST_DTYPES = {"fp16": torch.float16, "amp": torch.float16, "bf16": torch.bfloat16}


def precision_key(cfg):
    """The key the precision is read from, "TRAINER.<TRAINER.NAME upper>.PREC", or None when the
    trainer's node (or its PREC) does not exist."""
    node = cfg.TRAINER.get(cfg.TRAINER.NAME.upper())
    if not isinstance(node, dict) or "PREC" not in node:
        return None
    return f"TRAINER.{cfg.TRAINER.NAME.upper()}.PREC"


def resolve_precision(cfg) -> str:
    """Return the precision requested by ``cfg.TRAINER.<TRAINER.NAME upper>.PREC``, or "fp32" if absent."""
    if precision_key(cfg) is None:
        return "fp32"
    return cfg.TRAINER[cfg.TRAINER.NAME.upper()].PREC


class MixedPrecision:
    """Autocast and gradient scaling for one trainer.

    Args:
        requested (str): one of ``PRECISIONS``.
        device (torch.device): the trainer's device; anything but CUDA runs in fp32 unless
            ``cpu_autocast``.
        cpu_autocast (bool): on the CPU, autocast (and scale gradients) as on CUDA.

    Attributes:
        requested (str): the precision asked for.
        prec (str): the precision in effect ("fp32" on a CPU without ``cpu_autocast``, else ``requested``).
        dtype (torch.dtype or None): the autocast dtype, None when no autocast is used.
        scaler (torch.amp.GradScaler or None): present for fp16/amp when autocast is used.
    """

    def __init__(self, requested: str, device: torch.device, cpu_autocast: bool = False):
        if requested not in PRECISIONS:
            raise ValueError(
                f'Unknown precision "{requested}" (key TRAINER.<NAME>.PREC): '
                f"expected one of {list(PRECISIONS)}."
            )
        self.requested = requested
        self.device = torch.device(device)
        if self.device.type != "cuda" and not (cpu_autocast and self.device.type == "cpu"):
            if requested != "fp32":
                print(f"Precision {requested} was requested but the device is {self.device.type}: running in fp32"
                      + (" (TRAIN.CPU_AUTOCAST True autocasts on the CPU)" if self.device.type == "cpu" else ""))
            self.prec = "fp32"
        else:
            if requested == "bf16" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
                raise ValueError(
                    "Precision bf16 was requested (TRAINER.<NAME>.PREC) but this GPU does not support bfloat16; "
                    'use "fp16", "amp" or "fp32".'
                )
            self.prec = requested
        self.dtype: Optional[torch.dtype] = _AUTOCAST_DTYPES.get(self.prec)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.dtype is torch.float16 else None

    def drop_scaler_for_half_parameters(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Drop the scaler if an optimizer holds fp16/bf16 parameters.

        CoOp-family reference trainers convert their weights (learnable ones included) to fp16
        themselves; a GradScaler cannot unscale half-precision gradients, so such trainers step
        without one, as in Dassl.
        """
        if self.scaler is None:
            return
        half = (torch.float16, torch.bfloat16)
        if any(param.dtype in half for optim in optimizers for group in optim.param_groups for param in group["params"]):
            print(
                "Note: the optimizer holds half-precision parameters (the trainer converted its weights itself), "
                "so gradients are not scaled (no GradScaler)"
            )
            self.scaler = None

    def autocast(self):
        """Context manager for forward passes: autocast to ``dtype``, or a no-op when ``dtype`` is None."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (scaled when a scaler is active)."""
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def step(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Step every optimizer; with a scaler, steps go through it (skipped on inf/NaN grads) and it is updated once."""
        for optim in optimizers:
            if self.scaler is None:
                optim.step()
            else:
                self.scaler.step(optim)
        if self.scaler is not None:
            self.scaler.update()

    def skip_step(self) -> None:
        """A step was skipped for a non-finite loss: lower the scale as the scaler does after an overflow."""
        if self.scaler is not None and self.scaler.is_enabled():
            self.scaler.scale(torch.zeros((), device=self.device))  # creates the scale if no step used it yet
            self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())

    def state_dict(self) -> Optional[dict]:
        """The scaler's state (plain tensors and numbers), or None without a scaler."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Restore the scaler's state; ignored when either side has no scaler state."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
