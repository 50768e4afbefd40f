"""A check that per-step code creates no tensor on the wrong device, which works on a CPU alone.

On a GPU, ``torch.zeros(n)`` inside a step makes a CPU tensor; when it then meets the step's
data (``x + torch.zeros(n)``) the step fails or copies it to the GPU on every call. On a CPU the
same code runs without a sign, so a CPU test cannot see the fault by running it. This check
follows where such tensors go instead of where they are:

* a tensor made inside the checked block by a factory function (``torch.zeros``, ``arange``,
  ``tensor``, ``randn``, ...) without ``device=`` is marked with the place in the source that
  made it (a 0-dim tensor is not: PyTorch lets a 0-dim CPU tensor meet a GPU tensor);
* the mark passes to the result of an operation whose tensor operands are all marked
  (``torch.arange(n) * 2``), and is dropped by ``.to(device)`` / ``.to(other_tensor)`` /
  ``.cuda()``, the ways to put such a tensor where the data is;
* an operation whose operands mix a marked tensor with an unmarked one of at least one dimension
  (the data, a parameter, a buffer) is a fault, recorded with the marked tensor's source place.

The same mode records random draws whose numbers depend on the device: a draw on the device of
the data (dropout in training, ``torch.rand_like(x)``, ``x.normal_()``, ``torch.bernoulli(x)``,
``torch.randn(n, device=x.device)``, ...) takes the device's generator, so one seed gives other
numbers on a GPU than on a CPU. Drawing on the CPU (``torch.rand(n)``, the default generator,
saved with the checkpoints' RNG state) and moving the result is device independent.

Tensors made with the device of the data they meet (``torch.zeros(n, device=x.device)``), by
``x.new_zeros(n)`` or ``torch.zeros_like(x)``, and tensors made before the block (buffers) are
never marked. Random numbers drawn on the CPU with a CPU generator and then moved with
``.to(x.device)`` pass, which is the device-independent way to draw them.
"""
import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from vlprompt.utils import nested_tensors

FACTORIES = frozenset({
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.range, torch.linspace, torch.logspace,
    torch.eye, torch.tensor, torch.as_tensor, torch.randn, torch.rand, torch.randint, torch.randperm,
    torch.normal, torch.scalar_tensor, torch.tril_indices, torch.triu_indices,
})
MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})
RANDOM_FACTORIES = frozenset({torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal})
RANDOM_ON_DATA = frozenset({
    torch.nn.functional.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout, torch.nn.functional.feature_alpha_dropout,
    torch.dropout, torch.bernoulli, torch.rand_like, torch.randn_like, torch.randint_like, torch.multinomial,
    torch.poisson, torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.random_,
    torch.Tensor.exponential_, torch.Tensor.geometric_, torch.Tensor.cauchy_, torch.Tensor.log_normal_,
    torch.Tensor.bernoulli, torch.Tensor.multinomial,
})
_DROPOUTS = frozenset({
    torch.nn.functional.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout, torch.nn.functional.feature_alpha_dropout,
    torch.dropout,
})
_MARK = "_deviceless_origin"
_TORCH_DIR = os.path.dirname(torch.__file__)


@dataclass(frozen=True)
class Fault:
    """A device-less tensor met data, or a random draw used a data device's generator.

    Attributes:
        origin: "path:line" (relative to the repository when inside it) of the factory call or the draw.
        operation: the name of the operation where the tensor met the data, or of the draw.
    """

    origin: str
    operation: str


def _caller(root):
    """"path:line" of the innermost frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and path != __file__:
            if root and path.startswith(root):
                path = os.path.relpath(path, root)
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _names_a_device(args, kwargs):
    """Whether a ``.to``/``.cuda`` call names where the tensor goes (a device, or a tensor to follow)."""
    values = list(args[1:]) + list(kwargs.values())
    return any(isinstance(value, (torch.device, str, int, torch.Tensor)) and not isinstance(value, bool)
               for value in values) or "device" in kwargs


def _dropout_draws(func, args, kwargs):
    """Whether a dropout call draws a mask (p > 0 in training)."""
    names = ("p", "training") if func is not torch.dropout else ("p", "train")
    values = dict(zip(("input",) + names, args), **kwargs)
    return values.get("p", 0.5) > 0 and values.get(names[1], True)


def _draws_on_the_device(func, args, kwargs):
    """Whether ``func(*args, **kwargs)`` draws random numbers with the generator of a data device."""
    if kwargs.get("generator") is not None:
        return False
    if func in RANDOM_FACTORIES:
        return kwargs.get("device") is not None and not any(isinstance(arg, torch.Tensor) for arg in args)
    if func in _DROPOUTS:
        return _dropout_draws(func, args, kwargs)
    if func in RANDOM_ON_DATA:
        return any(not getattr(tensor, _MARK, None) for tensor in nested_tensors(args[:1]))
    return False


class DevicelessTensorCheck(TorchFunctionMode):
    """Context manager recording ``Fault``s (see the module docstring): tensors made without the
    data's device that meet the data in ``faults``, random draws with a data device's generator in
    ``device_draws``.

    Args:
        root: the repository root, to which the recorded source places are made relative.
    """

    def __init__(self, root=""):
        super().__init__()
        self.root = root
        self.faults = []
        self.device_draws = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _draws_on_the_device(func, args, kwargs):
            draw = Fault(_caller(self.root), getattr(func, "__name__", str(func)))
            if draw not in self.device_draws:
                self.device_draws.append(draw)
        result = func(*args, **kwargs)
        if func in FACTORIES:
            if kwargs.get("device") is None and isinstance(result, torch.Tensor) and result.dim() > 0:
                setattr(result, _MARK, _caller(self.root))
            return result
        operands = list(nested_tensors(args)) + list(nested_tensors(kwargs))
        marked = [tensor for tensor in operands if getattr(tensor, _MARK, None)]
        if not marked:
            return result
        if func in MOVES:
            if _names_a_device(args, kwargs):
                if result is args[0]:  # already where it was sent: the tensor itself is now placed
                    delattr(result, _MARK)
            elif isinstance(result, torch.Tensor) and result is not args[0]:
                setattr(result, _MARK, getattr(args[0], _MARK))
            return result
        data = [tensor for tensor in operands if not getattr(tensor, _MARK, None) and tensor.dim() > 0]
        if data:
            fault = Fault(getattr(marked[0], _MARK), getattr(func, "__name__", str(func)))
            if fault not in self.faults:
                self.faults.append(fault)
        else:
            for tensor in nested_tensors(result):
                if tensor.dim() > 0 and not getattr(tensor, _MARK, None):
                    setattr(tensor, _MARK, getattr(marked[0], _MARK))
        return result
