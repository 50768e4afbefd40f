"""A frozen open_clip model seen as two prompted towers plus its logit scale and bias.

The tower adapter of each tower is chosen from the model's classes (:func:`vision_tower`):

| image tower | adapter |
|---|---|
| open_clip ``VisionTransformer`` (OpenAI, LAION, MetaCLIP, DFN) | ``OpenCLIPVisionTower`` |
| timm ``VisionTransformer`` in a ``TimmModel`` (SigLIP, SigLIP2, register ViTs) | ``TimmViTVisionTower`` |
| timm ``Eva`` in a ``TimmModel`` (EVA02, PE-Core) | ``EvaVisionTower`` |
| anything else (ResNets, ConvNeXt, ...) | none: ``encode_image_plain`` only |

The text tower is open_clip's ``TextTransformer`` (on the model for OpenAI-layout ``CLIP``,
``model.text`` for ``CustomTextCLIP``), causal or bidirectional.
"""
from torch import nn

from .plan import EMPTY_PLAN
from .text import TextTower
from .tower import UnsupportedBackboneError

__all__ = ["CLIPRunner", "vision_tower"]


def vision_tower(visual):
    """The tower adapter of an open_clip image tower module.

    Raises:
        UnsupportedBackboneError: no adapter drives this tower (the message says why).
    """
    from open_clip.timm_model import TimmModel
    from open_clip.transformer import VisionTransformer

    from .timm_vision import EvaVisionTower, TimmViTVisionTower
    from .vision import OpenCLIPVisionTower

    if isinstance(visual, VisionTransformer):
        return OpenCLIPVisionTower(visual)
    if isinstance(visual, TimmModel):
        from timm.models.eva import Eva
        from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer

        if type(visual.trunk) is TimmVisionTransformer:
            return TimmViTVisionTower(visual)
        if type(visual.trunk) is Eva:
            return EvaVisionTower(visual)
        raise UnsupportedBackboneError(
            f"The image tower is timm's {type(visual.trunk).__name__}; the prompted runner drives timm's "
            "VisionTransformer (SigLIP, SigLIP2) and Eva (EVA02, PE-Core) towers (methods that only need "
            "image features can use CLIPRunner.encode_image_plain)."
        )
    raise UnsupportedBackboneError(
        f"The image tower is a {type(visual).__name__}; the prompted runner needs a ViT image tower "
        "(methods that only need image features can use CLIPRunner.encode_image_plain)."
    )


class CLIPRunner(nn.Module):
    """A frozen open_clip model seen as two prompted towers plus its logit scale and bias.

    Attributes:
        visual: the image tower's adapter (None for towers no adapter drives; see
            encode_image_plain and ``visual_error``).
        visual_error: why there is no image adapter (None when there is one).
        text: TextTower.
        logit_scale: the model's learned log temperature (frozen).
        logit_bias: the learned logit bias of sigmoid-trained models (SigLIP), else None.
    """

    def __init__(self, clip_model):
        super().__init__()
        self.visual_error = None
        try:
            self.visual = vision_tower(clip_model.visual)
        except UnsupportedBackboneError as error:
            self.visual, self.visual_error = None, str(error)
            self.plain_visual = clip_model.visual
        self.text = TextTower(getattr(clip_model, "text", clip_model))
        self.logit_scale = clip_model.logit_scale
        self.logit_bias = getattr(clip_model, "logit_bias", None)

    @property
    def dtype(self):
        return self.logit_scale.dtype

    def logits(self, image_features, text_features):
        """scale * cos + bias [B, C] from L2-normalised features [B, E] and [C, E]: the model's
        own scores (the bias of a sigmoid-trained model shifts every class equally)."""
        logits = self.logit_scale.exp() * image_features @ text_features.t()
        return logits if self.logit_bias is None else logits + self.logit_bias.to(logits.dtype)

    def encode_image_plain(self, images):
        """Image features [B, E] of the unmodified tower (any open_clip image tower)."""
        if self.visual is None:
            return self.plain_visual(images)
        return self.visual(images, rows=()).features

    def encode_image(self, images, plan=EMPTY_PLAN):
        """Image features [B, E] (not normalised)."""
        if self.visual is None:
            if plan is not EMPTY_PLAN:
                raise UnsupportedBackboneError(f"Prompted image encoding needs a driven image tower: {self.visual_error}")
            return self.plain_visual(images)
        return self.visual(images, plan, rows=()).features

    def encode_text(self, token_ids, plan=EMPTY_PLAN, last=None):
        """Text features [N, E] (not normalised); ``last``: see ``TextTower.forward``."""
        return self.text(token_ids, plan, last=last).features
