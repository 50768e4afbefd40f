"""Running averages of scalars (Dassl ``AverageMeter`` / ``MetricMeter``)."""
from collections import defaultdict

import torch

__all__ = ["AverageMeter", "MetricMeter"]


class AverageMeter:
    """Current value, sum, count and average of a scalar.

    Args:
        ema (bool): if True, ``avg`` is an exponential moving average
            (``avg = 0.9 * avg + 0.1 * val``) instead of the arithmetic mean.
    """

    def __init__(self, ema=False):
        self.ema = ema
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        """Record ``val`` (a number or a one-element tensor) observed ``n`` times."""
        if isinstance(val, torch.Tensor):
            val = val.item()
        self.val = val
        self.sum += val * n
        self.count += n
        if self.ema:
            self.avg = self.avg * 0.9 + self.val * 0.1
        else:
            self.avg = self.sum / self.count


class MetricMeter:
    """A dict of named :class:`AverageMeter` objects, created on first use.

    ``str(meter)`` gives "name val (avg)" per metric (4 decimals) in insertion order,
    joined by ``delimiter``, e.g. "loss 1.2345 (1.4000) acc 62.5000 (55.0000)".
    """

    def __init__(self, delimiter=" "):
        self.meters = defaultdict(AverageMeter)
        self.delimiter = delimiter

    def update(self, input_dict):
        """Update the meters from a dict name -> number or 0-dim tensor; None is ignored."""
        if input_dict is None:
            return
        if not isinstance(input_dict, dict):
            raise TypeError(
                "Input to MetricMeter.update() must be a dictionary, "
                f"but got {type(input_dict).__name__}"
            )
        for name, value in input_dict.items():
            if isinstance(value, torch.Tensor):
                value = value.item()
            self.meters[name].update(value)

    def __str__(self):
        return self.delimiter.join(
            f"{name} {meter.val:.4f} ({meter.avg:.4f})" for name, meter in self.meters.items()
        )
