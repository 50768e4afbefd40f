"""What a backbone's towers are, known before any weight or data is loaded.

``describe_backbone(name)`` builds the model's image tower on the meta device (shapes only: no
memory, no weights, no download) and asks the runner which adapter drives it, so that a
trainer refuses a backbone its method cannot run on with one paragraph before data loads
(``ClipTrainer.check_declared_cfg``), and a user sees which family a name belongs to.
"""
import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .loading import resolve_model_name
from .runner import TokenLayout, UnsupportedBackboneError, vision_tower

__all__ = ["BackboneInfo", "describe_backbone"]


@dataclass(frozen=True)
class BackboneInfo:
    """The image tower of a backbone as the runner sees it.

    Attributes:
        name: ``MODEL.BACKBONE.NAME``; model_name: its open_clip config name.
        image_adapter: the runner's adapter class name (e.g. "EvaVisionTower"), or None.
        image_error: why no adapter drives the image tower (None when one does).
        layout: the adapter's TokenLayout (None without an adapter).
        image_layers: blocks of the image tower (0 without an adapter: it takes no prompts).
        text_layers: blocks of the text tower (from the config).
    """

    name: str
    model_name: str
    image_adapter: Optional[str]
    image_error: Optional[str]
    layout: Optional[TokenLayout]
    image_layers: int
    text_layers: int


def describe_backbone(name):
    """BackboneInfo of ``MODEL.BACKBONE.NAME`` (an OpenAI name, an open_clip name or a
    model-config JSON); remembered per name (and a JSON file's modification time).

    Raises:
        CLIPLoadError: the name is unknown (the message lists what is accepted).
    """
    stamp = os.path.getmtime(name) if name.endswith(".json") and os.path.isfile(name) else None
    return _describe(name, stamp)


@functools.lru_cache(maxsize=32)
def _describe(name, stamp):
    import open_clip
    from open_clip.model import _build_vision_tower

    model_name, is_openai_name = resolve_model_name(name)
    config = open_clip.get_model_config(model_name)
    text_layers = config.get("text_cfg", {}).get("layers", 12)
    with torch.device("meta"):
        visual = _build_vision_tower(config["embed_dim"], config["vision_cfg"], quick_gelu=is_openai_name)
    try:
        adapter = vision_tower(visual)
    except UnsupportedBackboneError as error:
        return BackboneInfo(name, model_name, None, str(error), None, 0, text_layers)
    return BackboneInfo(name, model_name, type(adapter).__name__, None, adapter.layout, adapter.num_layers,
                        text_layers)
