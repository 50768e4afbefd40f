"""The feature-adapter family: CLIP-Adapter's residual bottleneck MLPs on CLIP's output features
(CLIP-Adapter, IJCV 2024).

``Adapter`` blends a feature with a small MLP of it, f' = (1 - a) f + a A(f); ``FeatureAdapters``
holds a node's image and optional text adapter (keys added by ``add_adapter_keys``, checked by
``check_adapter_node``); ``CLIPAdapterCLIP`` puts them on the template classifier of frozen CLIP.
Introduced by CLIP-Adapter (``trainers/clip_adapter.py``); RAdaAdapter extends the model.
"""
import torch.nn.functional as F
from torch import nn

from vlprompt.config import ConfigError
from vlprompt.methods.template_head import TemplateCLIP

__all__ = ["add_adapter_keys", "check_adapter_node", "Adapter", "FeatureAdapters", "CLIPAdapterCLIP"]


def add_adapter_keys(node, image_ratio, text_ratio, zero_init):
    """Add the adapter keys with the given defaults to a trainer node."""
    node.REDUCTION = 4  # bottleneck D -> D / REDUCTION -> D
    node.IMAGE_RATIO = image_ratio  # a in f' = (1 - a) f + a A(f); 0 = no image adapter
    node.TEXT_RATIO = text_ratio  # the same for the class text features
    node.ZERO_INIT = zero_init  # second layer starts at zero (no ReLU after it): f' = (1 - a) f at step 0


def check_adapter_node(node, name):
    """Raise ConfigError for invalid adapter keys of ``node``."""
    if node.REDUCTION < 1:
        raise ConfigError(f"{name}.REDUCTION must be >= 1, got {node.REDUCTION}.")
    for key in ("IMAGE_RATIO", "TEXT_RATIO"):
        if not 0.0 <= node[key] <= 1.0:
            raise ConfigError(f"{name}.{key} must be in [0, 1], got {node[key]}.")
    if node.IMAGE_RATIO == 0 and node.TEXT_RATIO == 0:
        raise ConfigError(f"{name}: IMAGE_RATIO and TEXT_RATIO are both 0, so there is nothing to train.")


class Adapter(nn.Module):
    """out = (1 - ratio) x + ratio * A(x), A(x) = ReLU(W2 ReLU(W1 x)), W1: [D / r, D], W2: [D, D / r].

    With ``zero_init``, W2 starts at zero and the last ReLU is left out, A(x) = W2 ReLU(W1 x):
    the adapter then only rescales x at step 0 (nothing changes after normalisation) and still
    learns. Behind a ReLU a zero layer would get no gradient at all (ReLU'(0) = 0), which is why
    the official RAda + Adapter code, which keeps it, never updates its adapters.

    Args:
        dim: D. reduction: r. ratio: the residual ratio. zero_init: see above.
    """

    def __init__(self, dim, reduction, ratio, zero_init):
        super().__init__()
        if dim // reduction < 1:
            raise ConfigError(f"REDUCTION {reduction} leaves no hidden unit for features of size {dim}.")
        self.ratio = ratio
        self.zero_init = zero_init
        self.down = nn.Linear(dim, dim // reduction, bias=False)
        self.up = nn.Linear(dim // reduction, dim, bias=False)
        if zero_init:
            nn.init.zeros_(self.up.weight)

    def forward(self, x):
        adapted = self.up(F.relu(self.down(x)))
        if not self.zero_init:
            adapted = F.relu(adapted)
        return (1 - self.ratio) * x + self.ratio * adapted


class FeatureAdapters(nn.Module):
    """The image adapter and the optional text adapter of a node (``add_adapter_keys``).

    Attributes:
        image, text: Adapter or None (ratio 0).
    """

    def __init__(self, dim, node):
        super().__init__()
        self.image = Adapter(dim, node.REDUCTION, node.IMAGE_RATIO, node.ZERO_INIT) if node.IMAGE_RATIO else None
        self.text = Adapter(dim, node.REDUCTION, node.TEXT_RATIO, node.ZERO_INIT) if node.TEXT_RATIO else None

    def forward(self, image_features, text_features):
        """Normalised adapted features ([B, D], [K, D]) from features [B, D] and [K, D]."""
        if self.image is not None:
            image_features = self.image(image_features)
        if self.text is not None:
            text_features = self.text(text_features)
        return F.normalize(image_features, dim=-1), F.normalize(text_features, dim=-1)


class CLIPAdapterCLIP(TemplateCLIP):
    """Frozen CLIP with CLIP-Adapter's feature adapters.

    Args:
        clip: CLIPRunner (frozen). tokenizer: Tokenizer. classnames: K names.
        templates: sentence templates. node: cfg.TRAINER.CLIPADAPTER.
    """

    def __init__(self, clip, tokenizer, classnames, templates, node):
        super().__init__(clip, tokenizer, classnames, templates)
        self.adapters = FeatureAdapters(clip.text.output_dim, node)

    def forward_features(self, image_features):
        return self.cosine_logits(*self.adapters(image_features, self.class_text_features()))

    def loss_features(self, image_features, labels):
        logits = self.forward_features(image_features)
        return F.cross_entropy(logits, labels), logits, {}

    def loss(self, images, labels):
        return self.loss_features(self.encode_image_features(images), labels)
