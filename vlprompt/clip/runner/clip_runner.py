"""A frozen open_clip CLIP model seen as two prompted towers plus a logit scale."""
from torch import nn

from .plan import EMPTY_PLAN
from .text import TextTower
from .tower import UnsupportedBackboneError
from .vision import VisionTower

__all__ = ["CLIPRunner"]


class CLIPRunner(nn.Module):
    """A frozen open_clip CLIP model seen as two prompted towers plus a logit scale.

    Attributes:
        visual: VisionTower (None for non-ViT image towers; see encode_image_plain).
        text: TextTower.
        logit_scale: CLIP's learned log temperature (frozen).
    """

    def __init__(self, clip_model):
        super().__init__()
        try:
            self.visual = VisionTower(clip_model.visual)
        except UnsupportedBackboneError:
            self.visual = None
            self.plain_visual = clip_model.visual
        self.text = TextTower(clip_model)
        self.logit_scale = clip_model.logit_scale

    @property
    def dtype(self):
        return self.logit_scale.dtype

    def encode_image_plain(self, images):
        """Image features [B, E] of the unmodified tower (any open_clip image tower).

        The last block of a ViT computes the class token only (``rows=[0]``; exact).
        """
        if self.visual is None:
            return self.plain_visual(images)
        return self.visual(images, rows=[0]).features

    def encode_image(self, images, plan=EMPTY_PLAN):
        """Image features [B, E] (not normalised); the last block computes the class token only."""
        if self.visual is None:
            if plan is not EMPTY_PLAN:
                raise UnsupportedBackboneError("Prompted image encoding needs a ViT CLIP image tower.")
            return self.plain_visual(images)
        return self.visual(images, plan, rows=[0]).features

    def encode_text(self, token_ids, plan=EMPTY_PLAN):
        """Text features [N, E] (not normalised)."""
        return self.text(token_ids, plan).features
