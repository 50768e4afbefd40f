"""The seeded random CLIP both sides of a comparison share, in memory or as a state-dict file.

Values are rounded to fp16 so that official code which casts to fp16 before its ``.float()``
(``clip.build_model``) holds exactly the same numbers as our fp32 model.

A backbone here is a ``MODEL.BACKBONE.NAME`` (an OpenAI name or an open_clip config), optionally at
another input size in OpenAI's own spelling: ``ViT-B/16@64px`` is ViT-B/16 (every width and depth)
with a 4 x 4 patch grid. The official code is given the name before the ``@`` (its model list has
no such entry) and builds the size from the state dict's positional embedding, as it does for any
file.
"""
import copy
import math
import re

import torch

from vlprompt.fileio import atomic_write

_SIZED = re.compile(r"(?P<name>.+)@(?P<size>[0-9]+)px")


def backbone_and_size(backbone):
    """(the name ``load_clip`` and the official code know, input size or None) of a backbone here:
    ``ViT-B/16@64px`` -> ("ViT-B/16", 64); OpenAI's own ``ViT-L/14@336px`` and plain names -> (name, None)."""
    from vlprompt.clip.loading import OPENAI_MODELS

    sized = _SIZED.fullmatch(backbone)
    if sized is None or backbone in OPENAI_MODELS:
        return backbone, None
    return sized["name"], int(sized["size"])


def _random_clip(backbone):
    from vlprompt.clip import load_clip

    name, size = backbone_and_size(backbone)
    return load_clip(name, "random", image_size=size)[0]


def _normal(generator, shape, std):
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def random_clip_state_dict(backbone, seed):
    """An OpenAI-layout CLIP state dict {key: tensor} of ``backbone`` with seeded random values.

    Keys and shapes are those of open_clip's model for the backbone (the OpenAI layout);
    values are drawn in sorted key order from one generator: LayerNorm weights 1 + N(0, 0.1²),
    biases N(0, 0.02²), projections N(0, 1/fan_in), other tensors N(0, 0.02²), logit_scale
    log(100); every value is rounded to fp16.
    """
    return _draw(_random_clip(backbone), seed)


def _draw(model, seed):
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, tensor in sorted(model.state_dict().items()):
        shape = tuple(tensor.shape)
        if key == "logit_scale":
            value = torch.full(shape, math.log(100.0))
        elif ("ln_" in key or "ln_final" in key) and key.endswith(".weight"):
            value = 1.0 + _normal(generator, shape, 0.1)
        elif key.endswith("bias"):
            value = _normal(generator, shape, 0.02)
        elif key in ("text_projection", "visual.proj"):
            value = _normal(generator, shape, shape[0] ** -0.5)
        else:
            value = _normal(generator, shape, 0.02)
        state[key] = value.half().float()
    return state


def dimensions(state):
    """(input resolution R, text width) of an OpenAI-layout state dict."""
    patch = state["visual.conv1.weight"].shape[-1]
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    return patch * grid, state["ln_final.weight"].shape[0]


def write_weights(backbone, seed, path):
    """Save the seeded random CLIP as a state-dict file; return (input resolution, text width)."""
    state = random_clip_state_dict(backbone, seed)
    with atomic_write(path) as f:
        torch.save(state, f)
    return dimensions(state)


_SEEDED = {}  # (backbone, seed) -> (the drawn model, the versions of its tensors when drawn)


def _tensors(model):
    return [*model.parameters(), *model.buffers()]


def _sharing_copy(model):
    """A copy of ``model`` (new modules, parameters and buffers) whose tensors are views of ``model``'s:
    the same memory and version counters, each with its own ``requires_grad`` and gradient."""
    memo = {}
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None and id(parameter) not in memo:
                memo[id(parameter)] = torch.nn.Parameter(parameter.detach(), requires_grad=parameter.requires_grad)
        for name, buffer in module._buffers.items():
            if buffer is not None and id(buffer) not in memo:
                memo[id(buffer)] = buffer.detach()
    return copy.deepcopy(model, memo)


def _kept_draw(backbone, seed):
    """The seeded random CLIP of (backbone, seed), drawn once per process (the last two pairs kept).

    Raises:
        RuntimeError: its weights were written in place since they were drawn (by a model sharing them).
    """
    key = (backbone, seed)
    if key not in _SEEDED:
        model = _random_clip(backbone)
        with torch.no_grad():
            model.load_state_dict(_draw(model, seed))
        while len(_SEEDED) >= 2:
            _SEEDED.pop(next(iter(_SEEDED)))
        _SEEDED[key] = (model, [tensor._version for tensor in _tensors(model)])
    model, versions = _SEEDED[key]
    if [tensor._version for tensor in _tensors(model)] != versions:
        del _SEEDED[key]
        raise RuntimeError(f"The seeded CLIP {backbone} (seed {seed}) was written in place by a model that shares "
                           f"its weights: seeded_clip(shared=True) is only for models that read their CLIP's weights.")
    return model


def seeded_clip(backbone, seed, shared=False):
    """The seeded random CLIP (``load_clip``'s frozen fp32 model, the values of
    ``random_clip_state_dict``), built without a file. The model is drawn once per process and copied
    for every caller; the last two (backbone, seed) pairs are kept (WiSE-FT's two ends).

    Args:
        shared: False: a fresh deep copy (ViT-B/16: about 600 MB copied, 0.3-0.9 s of CPU). True: new
            modules and parameters over the kept draw's memory (about 0.05 s), for a model that only
            reads its CLIP's weights (a frozen CLIP, or one whose gradients are read but no step taken);
            a write into them in place is found by the next call, which raises.
    """
    model = _kept_draw(backbone, seed)
    return _sharing_copy(model) if shared else copy.deepcopy(model)


def release_seeded_clips():
    """Drop the seeded CLIPs ``seeded_clip`` keeps (the next call draws again)."""
    _SEEDED.clear()


def seeded_dimensions(backbone, seed):
    """(input resolution R, text width) of ``seeded_clip(backbone, seed)``."""
    return dimensions(_kept_draw(backbone, seed).state_dict())
