"""Base class of method models: a frozen CLIP runner plus the method's learnable parts."""
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .templates import fill_template

__all__ = ["PromptedCLIP", "autocast_state"]


def autocast_state(device):
    """The autocast dtype in effect for ``device``'s type, or None outside autocast."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


class PromptedCLIP(nn.Module):
    """What every CLIP method model shares.

    Subclasses implement ``compute_text_features()`` (class text features [C, E] for the
    current class list) and ``forward(images)`` (logits [B, C]). Training uses
    ``loss(images, labels) -> (total, logits, terms)``: cross-entropy of ``forward``'s
    logits unless a method overrides it.

    Class text features are recomputed at every training step (they depend on learnable
    parts) but computed once per evaluation: without autograd, in eval mode or inside
    ``evaluation()``, the first call caches them, for the autocast state it ran under (another
    state computes them again); a ``train()``/``eval()`` switch, moving the model and leaving
    ``evaluation()`` drop the cache.

    Attributes:
        device_caches (tuple of str, class attribute): attributes holding tensors computed on the
            model's device (or None); moving or casting the model (``.to()``, ``.cuda()``,
            ``.half()``) sets them to None. A subclass with caches of its own extends it.

    Args:
        clip: the frozen CLIPRunner.
    """

    device_caches = ("_eval_text_features",)

    def __init__(self, clip):
        super().__init__()
        self.clip = clip
        self._eval_text_features = None
        self._eval_text_autocast = None
        self._evaluating = False

    def compute_text_features(self):
        raise NotImplementedError(f"{type(self).__name__} must implement compute_text_features().")

    def class_text_features(self):
        """L2-normalised class text features [C, E] (cached during evaluation, per autocast state)."""
        if torch.is_grad_enabled() or (self.training and not self._evaluating):
            return F.normalize(self.compute_text_features(), dim=-1)
        autocast = autocast_state(self.clip.logit_scale.device)
        if self._eval_text_features is None or self._eval_text_autocast != autocast:
            self._eval_text_features = F.normalize(self.compute_text_features(), dim=-1)
            self._eval_text_autocast = autocast
        return self._eval_text_features

    def _apply(self, fn, *args, **kwargs):
        for name in self.device_caches:
            setattr(self, name, None)
        return super()._apply(fn, *args, **kwargs)

    def train(self, mode=True):
        self._eval_text_features = None
        return super().train(mode)

    @contextmanager
    def evaluation(self):
        """Context of one evaluation: the learnable parts do not change, so class text
        features are computed at most once. Trainers evaluate inside it because they switch
        only their registered modules to eval mode (the model itself may stay in training
        mode, e.g. CoOp's, whose registered module is the prompt learner)."""
        self._evaluating, self._eval_text_features = True, None
        try:
            yield self
        finally:
            self._evaluating, self._eval_text_features = False, None

    def encode_sentences(self, token_ids):
        """Frozen-CLIP text features [N, E] (not normalised) of tokenized sentences [N, L].

        For one-off targets (hand-crafted or template-ensemble classifiers): the plain text
        tower runs once and, unlike ``clip.encode_text``, keeps nothing in the runner's
        prefix cache (which would hold [N, L, D] hidden states per call).
        """
        text = self.clip.text
        return text(embeddings=text.embed(token_ids), eot=text.eot_positions(token_ids)).features

    def zero_shot_weights(self, tokenizer, classnames, templates):
        """The zero-shot classifier [C, E] of WiSE-FT/FLYP (no autograd): for each class the mean
        of its L2-normalised sentence features over ``templates`` (format strings with one "{}"),
        L2-normalised again."""
        device = self.clip.logit_scale.device
        with torch.no_grad():
            features = [
                F.normalize(self.encode_sentences(tokenizer([fill_template(t, c) for c in classnames]).to(device)), dim=-1)
                for t in templates
            ]
        return F.normalize(torch.stack(features).mean(dim=0), dim=-1)

    @property
    def logit_scale(self):
        """CLIP's temperature exp(logit_scale) (frozen; 100 for OpenAI weights)."""
        return self.clip.logit_scale.exp()

    def cosine_logits(self, image_features, text_features):
        """The model's logits [B, C] from normalised features [B, E] and [C, E]: scale * cos,
        plus the logit bias of a sigmoid-trained model (the same for every class, so softmax
        cross-entropy, argmax and entropy over classes do not change)."""
        return self.clip.logits(image_features, text_features)

    def loss(self, images, labels):
        """(cross-entropy of the logits [B, C] of ``images`` [B, 3, H, W] against ``labels`` [B], logits, {})."""
        logits = self(images)
        return F.cross_entropy(logits, labels), logits, {}
