"""Image preprocessing from the backbone: the INPUT keys a config leaves empty.

``INPUT.SIZE``, ``INPUT.INTERPOLATION``, ``INPUT.PIXEL_MEAN``, ``INPUT.PIXEL_STD`` and
``INPUT.RESIZE_MODE`` default to empty, which means "the backbone's" (as open_clip's
``image_mean=None`` and timm's ``resolve_data_config``): a value a config file or the command
line gives wins; every empty key is filled once, when the backbone is known and before any data
loads, by :func:`resolve_input` (train.py does it and logs each value with where it came from;
the trainer and the data manager do it for a config that was not resolved).

The backbone's preprocessing (:func:`backbone_preprocess`) is what open_clip's
``create_model`` sets as ``model.visual.preprocess_cfg``, read without building the model; each
value comes from the first of

1. the pretrained tag of ``MODEL.BACKBONE.WEIGHTS`` (open_clip's pretrained config of the tag,
   e.g. SigLIP's mean and std 0.5 and squash resize, PE-Core's bilinear squash resize); an OpenAI
   backbone name (``ViT-B/16``) means the ``openai`` tag unless the weights are ``random``;
2. the ``preprocess_cfg`` of a model-config JSON given as ``MODEL.BACKBONE.NAME``;
3. without a tag (``random`` or a weights file) for an open_clip model name: the values all of that
   model's pretrained tags share (where they differ, none);
4. the mean and std of the timm image tower's pretrained config (the statistics its pretrained
   weights expect; its ImageNet evaluation crop is not CLIP's and is not used);
5. open_clip's defaults (``open_clip.transform.PreprocessCfg``: CLIP's mean and std, bicubic,
   shortest-edge resize and center crop).

The input size is always the image tower's (``vision_cfg.image_size``), as open_clip sets it.
Without a backbone (``MODEL.BACKBONE.NAME`` empty) the empty keys take Dassl's defaults
(``NO_BACKBONE_PREPROCESS``).
"""
import dataclasses
import os

from vlprompt.config import ConfigError

from .loading import backbone_config

__all__ = [
    "INTERPOLATIONS", "RESIZE_MODES", "PREPROCESS_KEYS", "NO_BACKBONE_PREPROCESS", "Preprocess", "backbone_preprocess",
    "resolve_input", "resolved_input",
]

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")

# How the test transform brings an image to INPUT.SIZE (INPUT.RESIZE_MODE; open_clip's resize modes):
# "shortest" resizes the shorter edge to max(INPUT.SIZE) and takes the center crop (CLIP's preprocessing),
# "squash" resizes to INPUT.SIZE without keeping the aspect ratio (SigLIP, PE-Core), "longest" resizes the
# longer edge to max(INPUT.SIZE) and pads the rest with black.
RESIZE_MODES = ("shortest", "squash", "longest")

# The image preprocessing keys that default to empty ("the backbone's").
PREPROCESS_KEYS = ("SIZE", "INTERPOLATION", "PIXEL_MEAN", "PIXEL_STD", "RESIZE_MODE")

# Their values when no backbone is named (MODEL.BACKBONE.NAME empty): Dassl's defaults.
NO_BACKBONE_PREPROCESS = {
    "SIZE": (224, 224),
    "INTERPOLATION": "bilinear",
    "PIXEL_MEAN": [0.485, 0.456, 0.406],
    "PIXEL_STD": [0.229, 0.224, 0.225],
    "RESIZE_MODE": "shortest",
}


# INPUT key -> the field of open_clip's PreprocessCfg (and pretrained configs) that holds it.
_OPEN_CLIP_FIELDS = {"INTERPOLATION": "interpolation", "PIXEL_MEAN": "mean", "PIXEL_STD": "std",
                     "RESIZE_MODE": "resize_mode"}


@dataclasses.dataclass
class Preprocess:
    """One preprocessing value and where it came from (a phrase for the log)."""

    value: object
    source: str


def _as_config_value(key, value):
    """``value`` in the type the config stores for ``key`` (SIZE a tuple, the statistics lists of floats)."""
    if key == "SIZE":
        return tuple(int(side) for side in ((value, value) if isinstance(value, int) else value))
    if key in ("PIXEL_MEAN", "PIXEL_STD"):
        return [float(channel) for channel in value]
    return value


def _pretrained_tag(config, weights):
    """The open_clip pretrained tag ``MODEL.BACKBONE.WEIGHTS`` stands for, or None (random, a file)."""
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(config.model_name)
    if weights and weights != "random" and not os.path.exists(weights) and weights in tags:
        return weights
    if config.is_openai_name and weights != "random" and "openai" in tags:
        return "openai"
    return None


def _shared_tag_values(model_name):
    """(values all pretrained tags of ``model_name`` agree on, the tags) of the PreprocessCfg fields."""
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(model_name)
    configs = [open_clip.get_pretrained_cfg(model_name, tag) for tag in tags]
    shared = {}
    for field in _OPEN_CLIP_FIELDS.values():
        values = {repr(tuple(c[field]) if isinstance(c.get(field), (list, tuple)) else c.get(field)) for c in configs}
        if configs and len(values) == 1 and configs[0].get(field) is not None:
            shared[field] = configs[0][field]
    return shared, tags


def _timm_normalisation(vision_cfg):
    """{"mean", "std"} of the timm image tower's pretrained config ({} for none)."""
    name = vision_cfg.get("timm_model_name")
    if not name:
        return {}
    from timm.models import get_pretrained_cfg

    try:
        pretrained = get_pretrained_cfg(name)
    except RuntimeError:  # "arch.tag" with a tag timm does not know (open_clip fails when it builds the model)
        return {}
    if pretrained is None or pretrained.mean is None or pretrained.std is None:
        return {}
    return {"mean": pretrained.mean, "std": pretrained.std}


def backbone_preprocess(name, weights=""):
    """The preprocessing of a backbone (module docstring), without building it.

    Args:
        name: ``MODEL.BACKBONE.NAME``. weights: ``MODEL.BACKBONE.WEIGHTS``.

    Returns:
        {INPUT key: :class:`Preprocess`} for every key of PREPROCESS_KEYS.

    Raises:
        CLIPLoadError: the backbone name cannot be resolved.
    """
    import open_clip
    from open_clip.transform import PreprocessCfg

    config = backbone_config(name)
    model = config.model_name
    vision_cfg = config.model_cfg.get("vision_cfg", {})
    layers = [("open_clip's defaults", dataclasses.asdict(PreprocessCfg()))]  # lowest precedence first
    timm_values = _timm_normalisation(vision_cfg)
    if timm_values:
        layers.append((f"the pretrained config of the timm image tower {vision_cfg['timm_model_name']}", timm_values))
    tag = _pretrained_tag(config, weights)
    if tag is None:
        shared, tags = _shared_tag_values(model)
        if shared:
            layers.append((f"the value every pretrained tag of {model} shares ({', '.join(tags)}); weights "
                           f"'{weights or 'none'}' have no tag", shared))
    if config.preprocess_cfg:
        layers.append((f"preprocess_cfg of the model config {name}", config.preprocess_cfg))
    if tag is not None:
        layers.append((f"open_clip's pretrained config of {model}, tag {tag}", open_clip.get_pretrained_cfg(model, tag)))
    result = {}
    for key, field in _OPEN_CLIP_FIELDS.items():
        source, values = next((source, values) for source, values in reversed(layers) if values.get(field) is not None)
        result[key] = Preprocess(_as_config_value(key, values[field]), source)
    size = vision_cfg.get("image_size", PreprocessCfg().size)
    result["SIZE"] = Preprocess(_as_config_value("SIZE", size),
                                f"the image tower's input size (vision_cfg.image_size of {model})")
    return {key: result[key] for key in PREPROCESS_KEYS}


def _preprocess_values(cfg):
    """{key: cfg.INPUT's value} of PREPROCESS_KEYS."""
    given = cfg.INPUT
    return {"SIZE": given.SIZE, "INTERPOLATION": given.INTERPOLATION, "PIXEL_MEAN": given.PIXEL_MEAN,
            "PIXEL_STD": given.PIXEL_STD, "RESIZE_MODE": given.RESIZE_MODE}


def _is_empty(value):
    return value in ("", None) or (isinstance(value, (list, tuple)) and len(value) == 0)


def _check_supported(values, name):
    """ConfigError for a backbone value the data pipeline does not implement (naming the key to set)."""
    checks = (("INTERPOLATION", INTERPOLATIONS), ("RESIZE_MODE", RESIZE_MODES))
    for key, choices in checks:
        if key in values and values[key].value not in choices:
            raise ConfigError(
                f"Backbone {name} preprocesses with {key.lower()} {values[key].value!r} ({values[key].source}), which "
                f"the data pipeline does not implement; set INPUT.{key} to one of {list(choices)}."
            )


def _format(key, value):
    return f"({value[0]}, {value[1]})" if key == "SIZE" else str(list(value) if isinstance(value, tuple) else value)


def resolve_input(cfg):
    """Fill the empty preprocessing keys of ``cfg.INPUT`` (PREPROCESS_KEYS) from its backbone.

    Returns:
        (cfg, lines): ``cfg`` itself when no key is empty, otherwise a clone with every empty key
        filled (frozen when ``cfg`` is); ``lines``: for the log, a heading and one line per key with
        its value and where it came from ("set by the config" for a key that was not empty).

    Raises:
        CLIPLoadError: the backbone name cannot be resolved.
        ConfigError: the backbone's interpolation or resize mode is not implemented here.
    """
    given = _preprocess_values(cfg)
    empty = [key for key in PREPROCESS_KEYS if _is_empty(given[key])]
    name = cfg.MODEL.BACKBONE.NAME
    if not empty:
        found = {}
    elif name:
        found = backbone_preprocess(name, cfg.MODEL.BACKBONE.WEIGHTS)
        _check_supported({key: found[key] for key in empty}, name)
    else:
        found = {key: Preprocess(value, "Dassl's default (no MODEL.BACKBONE.NAME)")
                 for key, value in NO_BACKBONE_PREPROCESS.items()}
    resolved = cfg
    if empty:
        resolved = cfg.clone()
        resolved.defrost()
        for key in empty:
            resolved.INPUT[key] = found[key].value
        if cfg.is_frozen():
            resolved.freeze()
    lines = [f"Image preprocessing (empty INPUT keys come from the backbone {name or '(none)'}):"]
    for key, value in _preprocess_values(resolved).items():
        where = found[key].source if key in empty else "set by the config"
        lines.append(f"  INPUT.{key} {_format(key, value)}: {where}")
    return resolved, lines


def resolved_input(cfg):
    """``cfg`` with its empty preprocessing keys filled (:func:`resolve_input`); the resolution is printed
    when the backbone filled any (a resolved ``cfg`` is returned as it is, and Dassl's values without a
    backbone are filled silently, as they were the defaults)."""
    resolved, lines = resolve_input(cfg)
    if resolved is not cfg and cfg.MODEL.BACKBONE.NAME:
        print("\n".join(lines))
    return resolved
