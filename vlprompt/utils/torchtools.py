"""Checkpoint files, random-number-generator states and parameter counting.

Checkpoint layout (Dassl; the names are :mod:`vlprompt.run_layout`'s): ``DIR/model.pth.tar-<N>``
(N = completed epochs), optional ``DIR/model-best.pth.tar`` and a text file ``DIR/checkpoint``
naming the most recently written file. A checkpoint is a dict with "state_dict", "epoch", "optimizer",
"scheduler", "val_result" and (ours) "rng_state"; ours hold only tensors and plain
containers, so they load with ``torch.load(weights_only=True)``.
"""
import os
import os.path as osp
import pickle
import random
import shutil
import warnings
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from vlprompt.run_layout import BEST_CHECKPOINT, POINTER_FILENAME, checkpoint_position, epoch_checkpoint_name

from .tools import atomic_write, mkdir_if_missing

__all__ = [
    "CheckpointError",
    "PickledObject",
    "save_checkpoint",
    "load_checkpoint",
    "resume_from_checkpoint",
    "check_checkpoint_content",
    "restore_checkpoint",
    "get_rng_state",
    "set_rng_state",
    "load_pretrained_weights",
    "count_num_param",
]


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be used (corrupt, truncated, wrong content)."""


def _strip_module_prefix(state_dict):
    """Copy of ``state_dict`` with one leading "module." (DataParallel) removed from each key."""
    return OrderedDict(
        (key[len("module."):] if key.startswith("module.") else key, value)
        for key, value in state_dict.items()
    )


def save_checkpoint(state, save_dir, is_best=False, remove_module_from_keys=True, model_name=""):
    """Save ``state`` to ``save_dir`` atomically and update the ``checkpoint`` pointer file.

    Args:
        state (dict): must contain "state_dict" and "epoch" (completed epochs).
        save_dir (str): folder of one registered model (created if missing).
        is_best (bool): also copy the file to ``model-best.pth.tar``.
        remove_module_from_keys (bool): strip a leading "module." from state-dict keys.
        model_name (str): file name; default ``"model.pth.tar-" + str(state["epoch"])``.

    Returns:
        str: path of the written checkpoint.
    """
    mkdir_if_missing(save_dir)
    if remove_module_from_keys:
        state = dict(state, state_dict=_strip_module_prefix(state["state_dict"]))
    if not model_name:
        model_name = epoch_checkpoint_name(state["epoch"])
    fpath = osp.join(save_dir, model_name)
    with atomic_write(fpath, "wb") as f:
        torch.save(state, f)
    print(f"Checkpoint saved to {fpath}")

    with atomic_write(osp.join(save_dir, POINTER_FILENAME), "w") as f:
        f.write(f"{osp.basename(fpath)}\n")

    if is_best:
        best_fpath = osp.join(save_dir, BEST_CHECKPOINT)
        with open(fpath, "rb") as src, atomic_write(best_fpath, "wb") as dst:
            shutil.copyfileobj(src, dst)
        print(f'Best checkpoint saved to "{best_fpath}"')
    return fpath


def load_checkpoint(fpath):
    """Load a checkpoint onto the CPU (or the default device when CUDA is available), never running code from it.

    Tries ``torch.load(weights_only=True)`` first. Checkpoints written by Dassl may hold
    pickled Python objects (a warm-up scheduler and, through it, an optimizer); those are
    loaded again with the same weights-only unpickler, each pickled class or function
    replaced by an inert :class:`PickledObject` that holds the pickled fields but never
    imports or runs the original (a one-line notice names them). Modules that torch
    refuses outright (os, sys, ...) make the file unloadable.

    Raises:
        FileNotFoundError: no file at ``fpath``.
        CheckpointError: the file cannot be read (e.g. truncated by an interrupted copy,
            not a PyTorch file, or it references a refused module); the message names the
            file and the reason.
    """
    if fpath is None:
        raise ValueError("File path is None")
    if not osp.exists(fpath):
        raise FileNotFoundError(f'File is not found at "{fpath}"')
    map_location = None if torch.cuda.is_available() else "cpu"
    try:
        return torch.load(fpath, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        pass  # pickled objects, or a corrupt file: listing the file's globals tells which
    except Exception as error:
        raise _unreadable_checkpoint(fpath, error) from error
    try:
        pickled_globals = torch.serialization.get_unsafe_globals_in_checkpoint(fpath)
        with torch.serialization.safe_globals([(_placeholder_class(name), name) for name in pickled_globals]):
            checkpoint = torch.load(fpath, map_location=map_location, weights_only=True)
    except Exception as error:
        raise _unreadable_checkpoint(fpath, error) from error
    print(
        f'Note: "{fpath}" holds pickled Python objects ({", ".join(sorted(pickled_globals))}); they were '
        "loaded as inert placeholders, without importing or running them"
    )
    return checkpoint


class PickledObject:
    """Inert stand-in for an object of a class that a checkpoint pickled (e.g. a Dassl scheduler).

    :func:`load_checkpoint` creates one subclass per pickled global, named after it, so
    ``type(obj).__name__`` is the original class name. Nothing of the original is imported
    or run: the constructor arguments are kept in ``pickled_args`` and a dict state becomes
    the instance's attributes (any other state is kept in ``pickled_state``).

    Attributes:
        pickled_global (str, class attribute): "module.QualifiedName" of the original.
    """

    pickled_global = ""

    def __new__(cls, *args, **kwargs):
        instance = super().__new__(cls)
        instance.pickled_args = args
        return instance

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, (dict, type(None))) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (__dict__, __slots__) states
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.pickled_state = state

    def __repr__(self):
        return f"<PickledObject {self.pickled_global}>"


def _placeholder_class(global_name):
    """A PickledObject subclass standing for ``global_name`` ("module.Name")."""
    return type(global_name.rsplit(".", 1)[-1], (PickledObject,), {"pickled_global": global_name})


def _unreadable_checkpoint(fpath, error):
    return CheckpointError(
        f'Unable to load checkpoint from "{fpath}": {type(error).__name__}: {_reason(error)}. '
        "The file may be truncated or corrupt (e.g. an interrupted save or copy), not a "
        "PyTorch checkpoint, or it references code that is never loaded; delete it or point to "
        "another checkpoint."
    )


def _reason(error):
    """The informative line of an exception's message (torch's unpickling errors run over many lines
    and name the refused global on a later one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    refused = [line for line in lines if "GLOBAL" in line]
    return (refused or lines or ["no details"])[0]


def _latest_checkpoint(fdir):
    """Path of the highest ``model.pth.tar-N`` in ``fdir``; else the file named by the
    pointer file (with a notice, since resuming from it is not exact); else FileNotFoundError."""
    positions = [checkpoint_position(name) for name in os.listdir(fdir)]
    epochs = [epochs_done for epochs_done, batches_done in filter(None, positions) if batches_done == 0]
    if epochs:
        return osp.join(fdir, epoch_checkpoint_name(max(epochs)))
    pointer = osp.join(fdir, POINTER_FILENAME)
    if osp.isfile(pointer):
        with open(pointer, "r", encoding="utf-8") as f:
            fname = f.readline().strip()
        print(
            f'Note: no {epoch_checkpoint_name("N")} in "{fdir}"; resuming from "{fname}" named by the '
            "pointer file (training restarts after that file's epoch)"
        )
        return osp.join(fdir, fname)
    raise FileNotFoundError(
        f'No checkpoint to resume from in "{fdir}": expected files named {epoch_checkpoint_name("N")} '
        f'or a "{POINTER_FILENAME}" pointer file'
    )


def _unwrap(model):
    """The module inside DataParallel / DistributedDataParallel, else ``model``."""
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


def _load_model_state(model, state_dict, fpath):
    """Load a saved state dict; parameters frozen in ``model`` may be absent from it
    (they are not saved by default), anything else missing or unexpected is an error."""
    model = _unwrap(model)
    result = model.load_state_dict(state_dict, strict=False)
    frozen = {name for name, param in model.named_parameters(remove_duplicate=False) if not param.requires_grad}
    missing = [key for key in result.missing_keys if key not in frozen]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f'Checkpoint "{fpath}" does not match the model: missing keys {missing}, '
            f"unexpected keys {result.unexpected_keys}. Was it written by another trainer or "
            "with another configuration?"
        )


def resume_from_checkpoint(fdir, model, optimizer=None, scheduler=None):
    """Resume one registered model from the highest ``model.pth.tar-N`` in ``fdir``.

    Loads the model weights, the optimizer and scheduler states when given and stored,
    and the random-number-generator states when the checkpoint has "rng_state".

    Returns:
        int: the stored epoch (number of completed epochs), i.e. the next epoch index.
    """
    fpath = _latest_checkpoint(fdir)
    print(f'Loading checkpoint from "{fpath}"')
    checkpoint = load_checkpoint(fpath)
    check_checkpoint_content(checkpoint, fpath)
    restore_checkpoint(checkpoint, fpath, model, optimizer, scheduler)
    if checkpoint.get("rng_state") is not None:
        set_rng_state(checkpoint["rng_state"])
        print("Loaded random number generator states")
    start_epoch = checkpoint["epoch"]
    print(f"Previous epoch: {start_epoch}")
    return start_epoch


def check_checkpoint_content(checkpoint, fpath):
    """Raise CheckpointError unless ``checkpoint`` is a dict with a "state_dict" of tensors and an int "epoch"."""
    problem = None
    if not isinstance(checkpoint, dict):
        problem = f"it holds a {type(checkpoint).__name__}, not a checkpoint dict"
    elif not isinstance(checkpoint.get("state_dict"), dict):
        problem = 'it has no "state_dict" dict'
    elif not all(isinstance(value, torch.Tensor) for value in checkpoint["state_dict"].values()):
        problem = 'its "state_dict" holds values that are not tensors'
    elif not isinstance(checkpoint.get("epoch"), int):
        problem = 'it has no integer "epoch"'
    if problem is not None:
        raise CheckpointError(f'Checkpoint "{fpath}" cannot be used: {problem}; delete it or point to another checkpoint.')


def restore_checkpoint(checkpoint, fpath, model, optimizer=None, scheduler=None):
    """Load a checkpoint's weights into ``model`` and, when both exist, its optimizer and scheduler states.

    Raises:
        CheckpointError: the weights do not match the model, or a stored optimizer or
            scheduler state does not fit the given one (the message names ``fpath``).
    """
    _load_model_state(model, checkpoint["state_dict"], fpath)
    print("Loaded model weights")
    for what, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is None or checkpoint.get(what) is None:
            continue
        try:
            target.load_state_dict(checkpoint[what])
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            raise CheckpointError(
                f'The {what} state in checkpoint "{fpath}" does not fit the configured {what} '
                f"({type(target).__name__}): {type(error).__name__}: {error}. Was it written with another "
                "OPTIM configuration?"
            ) from error
        print(f"Loaded {what}")


def get_rng_state():
    """States of every random number generator, as tensors and plain containers only.

    Returns:
        dict with
          "python": ``random.getstate()`` (a tuple of ints, and None or a float);
          "numpy": dict(algorithm=str, keys=int64 tensor [624], pos=int, has_gauss=int,
          cached_gaussian=float);
          "torch": uint8 tensor (CPU generator);
          "cuda": list of uint8 tensors, one per CUDA device (empty without CUDA).
    """
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "algorithm": algorithm,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    """Restore the states returned by :func:`get_rng_state`.

    CUDA states are restored for the devices present in both the state and this
    machine; a mismatch in device count prints a notice.
    """
    version, internal_state, gauss_next = state["python"]
    random.setstate((version, tuple(internal_state), gauss_next))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["algorithm"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda_states = state["cuda"]
    num_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(cuda_states) != num_devices:
        print(
            f"Note: the saved RNG state covers {len(cuda_states)} CUDA device(s), this machine "
            f"has {num_devices}; restoring the devices both have"
        )
    for index, cuda_state in enumerate(cuda_states[:num_devices]):
        torch.cuda.set_rng_state(cuda_state.cpu(), device=index)


def load_pretrained_weights(model, weight_path):
    """Load the entries of a checkpoint whose names and shapes match ``model``.

    Takes the checkpoint's "state_dict" if present, else the whole dict; strips
    "module."; entries with unknown names or other shapes are discarded (and listed).
    Warns when nothing matched.
    """
    checkpoint = load_checkpoint(weight_path)
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f'"{weight_path}" holds a {type(checkpoint).__name__}, not a checkpoint dict or state dict'
        )
    state_dict = checkpoint["state_dict"] if "state_dict" in checkpoint else checkpoint
    model_dict = model.state_dict()
    matched, discarded = OrderedDict(), []
    for key, value in _strip_module_prefix(state_dict).items():
        if key in model_dict and isinstance(value, torch.Tensor) and value.size() == model_dict[key].size():
            matched[key] = value
        else:
            discarded.append(key)
    model_dict.update(matched)
    model.load_state_dict(model_dict)
    if not matched:
        warnings.warn(f"Cannot load {weight_path} (check the key names manually)")
        return
    print(f"Successfully loaded pretrained weights from {weight_path}")
    if discarded:
        print(f"Layers discarded due to unmatched keys or size: {discarded}")


def count_num_param(model=None, params=None):
    """Total number of parameter elements of ``model``, or of ``params``
    (an iterable of tensors or of param-group dicts whose "params" is a tensor or a list)."""
    if model is not None:
        return sum(param.numel() for param in model.parameters())
    if params is not None:
        total = 0
        for item in params:
            if isinstance(item, dict):
                group = item["params"]
                group = [group] if isinstance(group, torch.Tensor) else group
                total += sum(param.numel() for param in group)
            else:
                total += item.numel()
        return total
    raise ValueError("count_num_param() needs a model or params")
