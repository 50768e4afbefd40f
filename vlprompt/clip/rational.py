"""RAda's rational matrix and its mask generator, "one last attention" (rada.md §1-3).

For a normalised image feature f [D] and normalised class features t [K, D], the rational
matrix is R[c, d] = f_d * t[c, d]; CLIP's logits are tau * sum_d R[c, d] (tau = exp of the
frozen logit scale). RAda predicts tau * sum_d M[c, d] * R[c, d] with a per-image mask
M = ReLU(1 + dM), where dM comes from one multi-query attention layer whose sequence axis is
the class axis, so classes interact:

* queries X1 = sqrt(tau) f (the same for every class row), X2 = sqrt(tau) t_c, X3 = tau R,
  each with its own projection; key and value both from tau R (shared projections W_k, W_v);
* per head, A_i = softmax(Q_i K^T / sqrt(d_head)) over the class axis ("row"; the official
  code's "global" variant normalises the whole K x K map, divides by TEMP and multiplies by
  K); the three maps are averaged, O = mean_i(A_i) V, heads are merged, then W_o;
* W_o's weight and bias start at zero, so dM = 0 and M = 1 (RAda == zero-shot CLIP) at step 0.

Because O is linear in the attention maps, mean_i(A_i) V = mean_i(A_i V): the row variant
runs three ``scaled_dot_product_attention`` calls (fused kernels on GPU, no K x K map in
memory), and images are processed in chunks so that ImageNet's K = 1000 fits.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ATTN_NORMS", "MASK_LOSSES", "RationalMaskGenerator", "rational_matrix", "rational_logits",
    "mask_regularizer",
]

ATTN_NORMS = ("row", "global")
MASK_LOSSES = ("l2", "l1", "linf", "mse")

# Elements of one chunk's attention maps (images x heads x K x K) when CHUNK_SIZE is 0 ("auto").
AUTO_CHUNK_ELEMENTS = 2 ** 26


def rational_matrix(image_features, class_features):
    """R[b, c, d] = f[b, d] * t[c, d].

    Args:
        image_features: [B, D] (normalised).
        class_features: [K, D] (normalised text features or classifier rows).
    Returns:
        [B, K, D].
    """
    return image_features.unsqueeze(1) * class_features.unsqueeze(0)


def rational_logits(rational, mask, scale):
    """Logits [B, K] = scale * sum_d mask * rational, from [B, K, D] tensors (summed in fp32,
    also under fp16 autocast)."""
    return scale * (mask.float() * rational.float()).sum(dim=-1)


def mask_regularizer(mask, kind="l2"):
    """Distance of the mask from all-ones, averaged over the batch (rada.md §3 and §8).

    * "l2": ||M - 1||_2 of each image's whole K x D mask (paper Eq. 7);
    * "linf": max |M - 1| per image (official code's default);
    * "l1": mean |M - 1| over all elements (the official code's L1Loss alternative);
    * "mse": mean (M - 1)^2 over all elements (official RAda + Adapter code).

    Args:
        mask: [B, K, D].
    Returns:
        scalar tensor.
    """
    deviation = (mask - 1).flatten(1).float()
    if kind == "l2":
        return deviation.norm(dim=1).mean()
    if kind == "linf":
        return deviation.abs().amax(dim=1).mean()
    if kind == "l1":
        return deviation.abs().mean()
    if kind == "mse":
        return deviation.pow(2).mean()
    raise ValueError(f"Unknown mask loss '{kind}': expected one of {list(MASK_LOSSES)}")


class RationalMaskGenerator(nn.Module):
    """The mask generator of RAda (see the module docstring).

    Learned tensors: ``q_image``, ``q_text``, ``q_rational``, ``key``, ``value`` and ``out``,
    each a D x D ``nn.Linear`` with bias; ``out`` starts at zero.

    Args:
        dim: feature size D (divisible by ``num_heads``).
        num_heads: H (8 in the paper).
        attn_norm: "row" (paper Eq. 6) or "global" (official code).
        temperature: divides the attention scores (TEMP of the official code; 1 = none).
        chunk_size: images per chunk; 0 picks the largest chunk whose attention maps have at
            most ``AUTO_CHUNK_ELEMENTS`` elements.
    """

    def __init__(self, dim, num_heads=8, attn_norm="row", temperature=1.0, chunk_size=0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"The feature size {dim} is not divisible by {num_heads} heads.")
        if attn_norm not in ATTN_NORMS:
            raise ValueError(f"Unknown attention normalisation '{attn_norm}': expected one of {list(ATTN_NORMS)}")
        self.num_heads = num_heads
        self.attn_norm = attn_norm
        self.temperature = float(temperature)
        self.chunk_size = int(chunk_size)
        self.q_image = nn.Linear(dim, dim)
        self.q_text = nn.Linear(dim, dim)
        self.q_rational = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, image_features, class_features, scale):
        """The mask M = ReLU(1 + dM).

        Args:
            image_features: [B, D] normalised.
            class_features: [K, D] normalised (shared by the batch).
            scale: tau, CLIP's temperature (a scalar tensor; not trained).
        Returns:
            [B, K, D].
        """
        scale = scale.detach()
        text_query = self._split_heads(self.q_text(scale.sqrt() * class_features))  # [H, K, dh]
        num_images, num_classes = image_features.shape[0], class_features.shape[0]
        chunk = self._images_per_chunk(num_classes) or num_images
        masks = [
            torch.relu(1 + self._delta(image_features[start:start + chunk], class_features, text_query, scale))
            for start in range(0, num_images, chunk)
        ]
        return masks[0] if len(masks) == 1 else torch.cat(masks)

    def _images_per_chunk(self, num_classes):
        if self.chunk_size > 0:
            return self.chunk_size
        return max(1, AUTO_CHUNK_ELEMENTS // (self.num_heads * num_classes * num_classes))

    def _split_heads(self, x):
        """[..., L, D] -> [..., H, L, D / H]."""
        x = x.unflatten(-1, (self.num_heads, -1))
        return x.transpose(-3, -2)

    def _delta(self, image_features, class_features, text_query, scale):
        """dM [b, K, D] for one chunk of b images."""
        rational = scale * rational_matrix(image_features, class_features)  # [b, K, D]
        key = self._split_heads(self.key(rational))  # [b, H, K, dh]
        value = self._split_heads(self.value(rational))
        image_query = self._split_heads(self.q_image(scale.sqrt() * image_features).unsqueeze(1))  # [b, H, 1, dh]
        rational_query = self._split_heads(self.q_rational(rational))
        text_query = text_query.to(key.dtype).expand(image_features.shape[0], -1, -1, -1)
        # X1 is the same in every class row, so its map has identical rows and the global
        # normalisation (sum over the K x K map, times K) reduces to the row softmax.
        output = self._attend_rows(image_query, key, value)  # [b, H, 1, dh], broadcast over K
        output = output + self._attend(text_query, key, value) + self._attend(rational_query, key, value)
        output = (output / 3).transpose(1, 2).flatten(2)  # [b, K, D]
        return self.out(output)

    def _attend(self, query, key, value):
        if self.attn_norm == "row":
            return self._attend_rows(query, key, value)
        scores = query @ key.transpose(-2, -1) / (math.sqrt(query.shape[-1]) * self.temperature)
        num_classes = scores.shape[-1]
        weights = scores.flatten(-2).softmax(dim=-1).view_as(scores) * num_classes
        return weights @ value

    def _attend_rows(self, query, key, value):
        scale = 1.0 / (math.sqrt(query.shape[-1]) * self.temperature)
        return F.scaled_dot_product_attention(query, key, value, scale=scale)
