"""Memoised CLIP construction and weights-file reads for a test process (installed by conftest.py).

Hundreds of tests build a trainer on one of a few tiny random CLIPs. Each build runs open_clip's
``create_model`` (a random initialisation that the weights file then overwrites) and reads the
weights file with torch's weights-only unpickler: about 70 ms of CPU per build, more than the rest
of most such tests. Both are deterministic, so a test process memoises them:

* ``open_clip.create_model(name, pretrained=None, ...)`` on the CPU is a function of its arguments,
  of the model config registered under ``name`` and of torch's CPU generator state, which it
  advances. A repeated call (same arguments, config, default dtype and generator state) returns a
  deep copy of the model that the first call built, as it was before its caller changed it, and
  leaves the generator in the state the first call left it in: what building it again gives.
* ``open_clip.factory.load_state_dict(path, ...)`` (what ``open_clip.load_checkpoint`` reads a
  file with) is a function of the file's bytes: a repeated read of the same bytes returns copies of
  the tensors the first read gave.

Only small models and files are kept (MAX_ENTRIES of each, the least recently used dropped
first). Downloads (``pretrained`` set), Hugging Face text towers (their configs come from files),
other devices and a call that touched Python's or NumPy's generator are not memoised.
"""
import collections
import copy
import hashlib
import os
import random

import numpy as np
import torch

MAX_ENTRIES = 8
MAX_PARAMETERS = 20_000_000  # the tiny test CLIPs have about 1.7 million
MAX_FILE_BYTES = 128 * 2**20

_models = collections.OrderedDict()  # key -> (pristine model, generator state after building it)
_state_dicts = collections.OrderedDict()  # (arguments, sha256 of the file) -> state dict
_uncacheable = set()
ORIGINALS = {}  # name -> the unwrapped function, once installed


def _remember(cache, key, value):
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > MAX_ENTRIES:
        cache.popitem(last=False)


def _other_generators():
    return random.getstate(), np.random.get_state()[1].tobytes()


def _model_key(open_clip, args, kwargs):
    """The memo key of a create_model call, or None when the call is not memoised."""
    name = args[0] if args else kwargs.get("model_name")
    if not isinstance(name, str) or len(args) > 1 or kwargs.get("pretrained") is not None:
        return None
    if kwargs.get("device") not in (None, "cpu") or kwargs.get("pretrained_image") or kwargs.get("cache_dir"):
        return None
    config = open_clip.get_model_config(name)
    if config is None or "hf_" in repr(config):
        return None
    generator = hashlib.sha256(torch.random.get_rng_state().numpy().tobytes()).hexdigest()
    return name, repr(config), repr(sorted(kwargs.items())), str(torch.get_default_dtype()), generator


def install():
    """Wrap ``open_clip.create_model`` and ``open_clip.factory.load_state_dict`` (for the process)."""
    import open_clip
    import open_clip.factory as factory

    if ORIGINALS:
        return
    create_model, load_state_dict = open_clip.create_model, factory.load_state_dict
    ORIGINALS.update(create_model=create_model, load_state_dict=load_state_dict)

    def memo_create_model(*args, **kwargs):
        key = _model_key(open_clip, args, kwargs)
        if key is None or key in _uncacheable:
            return create_model(*args, **kwargs)
        if key in _models:
            _models.move_to_end(key)
            pristine, generator_after = _models[key]
            torch.random.set_rng_state(generator_after)
            return copy.deepcopy(pristine)
        others = _other_generators()
        model = create_model(*args, **kwargs)
        if _other_generators() != others or sum(p.numel() for p in model.parameters()) > MAX_PARAMETERS:
            _uncacheable.add(key)
        else:
            _remember(_models, key, (copy.deepcopy(model), torch.random.get_rng_state()))
        return model

    def memo_load_state_dict(checkpoint_path, *args, **kwargs):
        path = str(checkpoint_path)
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
            return load_state_dict(checkpoint_path, *args, **kwargs)
        with open(path, "rb") as f:
            key = (path.endswith(".safetensors"), repr(args), repr(sorted(kwargs.items())),
                   hashlib.sha256(f.read()).hexdigest())
        if key not in _state_dicts:
            state_dict = load_state_dict(checkpoint_path, *args, **kwargs)
            if not (isinstance(state_dict, dict) and all(isinstance(v, torch.Tensor) for v in state_dict.values())):
                return state_dict
            _remember(_state_dicts, key, {name: tensor.clone() for name, tensor in state_dict.items()})
            return state_dict
        _state_dicts.move_to_end(key)
        return {name: tensor.clone() for name, tensor in _state_dicts[key].items()}

    open_clip.create_model = factory.create_model = memo_create_model
    factory.load_state_dict = memo_load_state_dict
