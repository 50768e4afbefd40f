"""TRAIN.COMPILE: the model's step methods compiled with ``torch.compile``, for every trainer.

Every trainer runs its model through a few methods of ``self.model``: the training step's
forward and loss (``loss``, ``loss_features`` on cached features, ``losses``, ``objective``) and
the evaluation forward (``forward``, i.e. ``model(images)``, and ``forward_features``).
With TRAIN.COMPILE set to a backend, :func:`compile_step_methods` replaces each of these methods
that the model defines by its compiled version, on the model instance; nothing else changes:

* the modules are not wrapped, so checkpoints keep their state-dict names (no ``_orig_mod.``
  prefix) and a compiled run resumes from, and writes, the same files as an eager one;
* the backward pass, the optimizer step and the logging stay in the engine, as without compiling;
  the step's summary holds device tensors that the progress line reads when it prints
  (``steps.step_summary``), so reporting a step makes the host wait for nothing (the non-finite
  loss check still reads one flag per step: it stops before the weights change);
* shapes are static (``dynamic=False``): a batch of another size (an epoch's last, an evaluation's
  last) compiles once more. On CUDA the inductor backend runs in ``mode="reduce-overhead"``
  (CUDA graphs): the engine then marks the start of every step and evaluation batch
  (:func:`mark_step`) and the compiled methods return copies of their tensors, which the next
  replay would otherwise overwrite. Elsewhere the backend's default mode is used.

Backends (:data:`COMPILE_BACKENDS`): "inductor" (generated kernels; needs a C++ compiler on the
CPU), "aot_eager" (traced forward and backward graphs run by PyTorch's own kernels) and "eager"
(the traced forward graph only): the last two check that a step traces, without the cost of
generating code. A trainer whose step cannot be traced into one graph says why in
``compile_graph_breaks`` (a class attribute); its methods are still compiled, each graph break
then returning to Python. A trainer that does not run its model through these methods says why
in ``compile_refusal`` and refuses TRAIN.COMPILE before any data loads (the test-time trainers).
"""
import torch

from vlprompt.config import ConfigError
from vlprompt.utils import map_tensors

__all__ = ["COMPILE_BACKENDS", "STEP_METHODS", "check_compile_cfg", "compile_mode", "compile_step_methods",
           "mark_step"]

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
# The methods through which trainers run their model in a training step and an evaluation.
STEP_METHODS = ("forward", "forward_features", "loss", "loss_features", "losses", "objective")


def check_compile_cfg(cfg):
    """Raise ConfigError unless TRAIN.COMPILE is "" (off) or one of COMPILE_BACKENDS."""
    value = cfg.TRAIN.COMPILE
    if value != "" and value not in COMPILE_BACKENDS:
        raise ConfigError(
            f"TRAIN.COMPILE is {value!r}, but it must be empty (no compiling, the default) or the name of a "
            f"torch.compile backend among {list(COMPILE_BACKENDS)}: \"inductor\" generates kernels (on the CPU "
            "it needs a C++ compiler), \"aot_eager\" and \"eager\" only trace the step (to check it compiles)."
        )


def compile_mode(backend, device):
    """torch.compile's ``mode``: "reduce-overhead" (CUDA graphs) for inductor on CUDA, else None (default)."""
    return "reduce-overhead" if backend == "inductor" and device.type == "cuda" else None


def _copying(function):
    def call(*args, **kwargs):
        return map_tensors(torch.Tensor.clone, function(*args, **kwargs))  # each output a copy of its own

    call.__wrapped__ = function
    return call


def compile_step_methods(model, backend, device, fullgraph=False):
    """Replace the STEP_METHODS that ``model`` defines by compiled versions, on the instance.

    Args:
        model: the trainer's model (an nn.Module).
        backend: one of COMPILE_BACKENDS.
        device: the trainer's device (chooses the mode, see :func:`compile_mode`).
        fullgraph: raise at a graph break instead of running that part in Python (for checks).

    Returns:
        (the names of the compiled methods, the mode or None).
    """
    mode = compile_mode(backend, device)
    names = [name for name in STEP_METHODS if callable(getattr(model, name, None))]
    for name in names:
        compiled = torch.compile(getattr(model, name), backend=backend, mode=mode, dynamic=False, fullgraph=fullgraph)
        # nn.Module keeps a plain attribute in the instance's __dict__: state_dict() does not see it
        setattr(model, name, _copying(compiled) if mode == "reduce-overhead" else compiled)
    return names, mode


def mark_step(mode):
    """Tell CUDA graphs that a new step (or evaluation batch) begins, under "reduce-overhead"."""
    if mode == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()
