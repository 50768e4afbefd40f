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
    """A dict of named :class:`AverageMeter` objects, created on first use, that reads tensors late.

    ``update`` keeps a step's values as they are (a tensor is only detached), so a training step
    is not made to wait for the device by its report; the values are read (one transfer per device) and folded into
    the meters, in step order, when the meters are read: ``meters``, ``str(meter)`` or ``read()``.
    The averages are those of reading each value at its step (``float`` of each, summed in order).

    ``str(meter)`` gives "name val (avg)" per metric (4 decimals) in insertion order,
    joined by ``delimiter``, e.g. "loss 1.2345 (1.4000) acc 62.5000 (55.0000)".
    """

    def __init__(self, delimiter=" "):
        self._meters = defaultdict(AverageMeter)
        self._unread = []  # one {name: number or 0-dim tensor} per update not yet folded in
        self.delimiter = delimiter

    def update(self, input_dict):
        """Record a step's dict name -> number or one-element tensor (None: a step without values)."""
        if input_dict is None:
            self._unread.append({})
            return
        if not isinstance(input_dict, dict):
            raise TypeError(
                "Input to MetricMeter.update() must be a dictionary, "
                f"but got {type(input_dict).__name__}"
            )
        for name, value in input_dict.items():
            if isinstance(value, torch.Tensor) and value.numel() != 1:
                raise ValueError(f"MetricMeter.update(): {name} has {value.numel()} elements, expected one")
        self._unread.append({name: value.detach() if isinstance(value, torch.Tensor) else value
                             for name, value in input_dict.items()})

    def read(self):
        """Fold the values not yet read into the meters; returns, per update since the last read,
        {name: average} of every meter after that update."""
        tensors = [value for step in self._unread for value in step.values() if isinstance(value, torch.Tensor)]
        numbers = {id(tensor): number for tensor, number in zip(tensors, _numbers(tensors))}
        averages = []
        for step in self._unread:
            for name, value in step.items():
                self._meters[name].update(numbers[id(value)] if isinstance(value, torch.Tensor) else value)
            averages.append({name: meter.avg for name, meter in self._meters.items()})
        self._unread = []
        return averages

    @property
    def meters(self):
        """{name: AverageMeter}, every value recorded so far folded in."""
        self.read()
        return self._meters

    def __str__(self):
        return self.delimiter.join(
            f"{name} {meter.val:.4f} ({meter.avg:.4f})" for name, meter in self.meters.items()
        )


def _numbers(tensors):
    """``float`` of each one-element tensor, in order, with one transfer per device (float64 holds
    every float32, float16 and bfloat16 value exactly)."""
    numbers = [None] * len(tensors)
    by_device = defaultdict(list)
    for index, tensor in enumerate(tensors):
        by_device[tensor.device].append(index)
    for indices in by_device.values():
        values = torch.stack([tensors[index].reshape(()).to(torch.float64) for index in indices]).tolist()
        for index, value in zip(indices, values):
            numbers[index] = value
    return numbers
