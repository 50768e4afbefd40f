"""The template classifier of zero-shot CLIP: class text features averaged over hand-crafted sentences.

Introduced by zero-shot CLIP (``trainers/zsclip.py``); CLIP-Adapter, RAda and RAdaTTT put their
learned parts on top of this classifier.
"""
import torch
import torch.nn.functional as F

from vlprompt.clip import PromptedCLIP, fill_template
from vlprompt.clip.model import autocast_state

__all__ = ["TemplateCLIP"]


class TemplateCLIP(PromptedCLIP):
    """Frozen CLIP whose classifier is the mean of normalised template features.

    The classifier depends on the frozen text tower and the class names only, so it is computed
    once (without autograd) per autocast state and kept, in training steps too (methods built on
    it learn on top of it: CLIP-Adapter's text adapter, RAda's mask generator); a training step
    then runs no text tower.

    Args:
        clip: CLIPRunner.
        tokenizer: Tokenizer.
        classnames: C class names.
        templates: format strings with one "{}".
    """

    device_caches = PromptedCLIP.device_caches + ("_classifier",)

    def __init__(self, clip, tokenizer, classnames, templates):
        super().__init__(clip)
        sentences = [[fill_template(t, name) for name in classnames] for t in templates]
        for group in sentences:
            print(f"Prompts: {group}")
        ids = torch.stack([tokenizer(group) for group in sentences])  # [T, C, L]
        self.register_buffer("token_ids", ids, persistent=False)
        self._classifier = None
        self._classifier_autocast = None

    def compute_text_features(self):
        features = [F.normalize(self.clip.encode_text(ids), dim=-1) for ids in self.token_ids]
        return torch.stack(features).mean(dim=0)

    def class_text_features(self):
        """L2-normalised class text features [C, E], computed once per autocast state (class docstring)."""
        autocast = autocast_state(self.clip.logit_scale.device)
        if self._classifier is None or self._classifier_autocast != autocast:
            with torch.no_grad():
                self._classifier = F.normalize(self.compute_text_features(), dim=-1)
            self._classifier_autocast = autocast
        return self._classifier

    def encode_image_features(self, images):
        """Features [B, E] of the frozen image encoder (not normalised; what FEATURE_CACHE stores)."""
        return self.clip.encode_image(images)

    def forward_features(self, image_features):
        """Logits [B, C] from features of ``encode_image_features``."""
        return self.cosine_logits(F.normalize(image_features, dim=-1), self.class_text_features())

    def forward(self, images):
        return self.forward_features(self.encode_image_features(images))
