"""RAda's rational matrix and its mask generator, "one last attention".

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
runs one ``scaled_dot_product_attention`` call per query (fused kernels on GPU, no K x K map
in memory), and images are processed in chunks so that ImageNet's K = 1000 fits. The
``queries`` option keeps a subset of {X1, X2, X3} (the paper's Table 4 ablation; the mean is
then over the kept queries).

:class:`RationalAdapter` composes a mask generator with the mask loss: the RAda trainers hold
one instead of re-implementing logits and loss. Other generators (MLP, stacked attention
layers) and the registry that builds them from a config are in
:mod:`vlprompt.methods.rada_mask_generators`.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from vlprompt.config import ConfigError

__all__ = [
    "ATTN_NORMS", "MASK_LOSSES", "QUERY_INPUTS", "RationalAdapter", "RationalMaskGenerator", "attend",
    "attention_options", "check_queries", "images_in_chunks", "mask_regularizer", "rational_logits",
    "rational_matrix", "split_heads",
]

ATTN_NORMS = ("row", "global")
MASK_LOSSES = ("l2", "l1", "linf", "mse")
# The attention generator's query inputs: X1 = sqrt(tau) f, X2 = sqrt(tau) t_c, X3 = tau R.
QUERY_INPUTS = ("image", "text", "rational")

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
    """Distance of the mask from all-ones, averaged over the batch, in one of four norms.

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


def split_heads(x, num_heads):
    """[..., L, D] -> [..., H, L, D / H]."""
    return x.unflatten(-1, (num_heads, -1)).transpose(-3, -2)


def attend(query, key, value, attn_norm="row", temperature=1.0):
    """Attention over the class axis, per head.

    Args:
        query: [..., H, Lq, dh]; key, value: [..., H, K, dh].
        attn_norm: "row" (softmax over the K keys of each query row) or "global" (softmax over
            the whole Lq x K map, times K: the official code).
        temperature: divides the scores (besides sqrt(dh)).
    Returns:
        [..., H, Lq, dh].
    """
    if attn_norm == "row":
        scale = 1.0 / (math.sqrt(query.shape[-1]) * temperature)
        return F.scaled_dot_product_attention(query, key, value, scale=scale)
    scores = query @ key.transpose(-2, -1) / (math.sqrt(query.shape[-1]) * temperature)
    num_classes = scores.shape[-1]
    weights = scores.flatten(-2).softmax(dim=-1).view_as(scores) * num_classes
    return weights @ value


def images_in_chunks(mask_of_chunk, image_features, chunk):
    """Concatenate ``mask_of_chunk(image_features[i:i + chunk])`` over the batch (dim 0)."""
    masks = [mask_of_chunk(image_features[start:start + chunk]) for start in range(0, image_features.shape[0], chunk)]
    return masks[0] if len(masks) == 1 else torch.cat(masks)


def attention_options(node, dim):
    """The attention generators' keyword arguments from a RAda trainer node (its NUM_HEADS,
    ATTN_NORM, TEMP, CHUNK_SIZE and GENERATOR.QUERIES); ConfigError if NUM_HEADS does not
    divide ``dim``."""
    if dim % node.NUM_HEADS:
        raise ConfigError(
            f"NUM_HEADS {node.NUM_HEADS} does not divide the CLIP feature size {dim}; pick a divisor of {dim}."
        )
    return dict(num_heads=node.NUM_HEADS, attn_norm=node.ATTN_NORM, temperature=node.TEMP,
                chunk_size=node.CHUNK_SIZE, queries=tuple(node.GENERATOR.QUERIES))


def check_queries(queries):
    """``queries`` as a tuple, or ValueError unless it is a non-empty subset of QUERY_INPUTS."""
    queries = tuple(queries)
    if not queries or len(set(queries)) != len(queries) or not set(queries) <= set(QUERY_INPUTS):
        raise ValueError(
            f"The attention queries must be distinct names among {list(QUERY_INPUTS)} (at least one), "
            f"got {list(queries)}."
        )
    return queries


class RationalMaskGenerator(nn.Module):
    """The mask generator of RAda (see the module docstring); registered as the default
    generator in :mod:`vlprompt.methods.rada_mask_generators`.

    Learned tensors: ``q_image``, ``q_text``, ``q_rational`` (those of ``queries``), ``key``,
    ``value`` and ``out``, each a D x D ``nn.Linear`` with bias; ``out`` starts at zero.

    Args:
        dim: feature size D (divisible by ``num_heads``).
        num_heads: H (8 in the paper).
        attn_norm: "row" (paper Eq. 6) or "global" (official code).
        temperature: divides the attention scores (TEMP of the official code; 1 = none).
        chunk_size: images per chunk; 0 picks the largest chunk whose attention maps have at
            most ``AUTO_CHUNK_ELEMENTS`` elements.
        queries: the query inputs among QUERY_INPUTS (paper: all three; Table 4 ablates
            "rational" alone, with "image" or with "text").
    """

    def __init__(self, dim, num_heads=8, attn_norm="row", temperature=1.0, chunk_size=0, queries=QUERY_INPUTS):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"The feature size {dim} is not divisible by {num_heads} heads.")
        if attn_norm not in ATTN_NORMS:
            raise ValueError(f"Unknown attention normalisation '{attn_norm}': expected one of {list(ATTN_NORMS)}")
        self.queries = check_queries(queries)
        self.num_heads = num_heads
        self.attn_norm = attn_norm
        self.temperature = float(temperature)
        self.chunk_size = int(chunk_size)
        for name in QUERY_INPUTS:  # created in this order, so a seed gives the same weights
            if name in self.queries:
                setattr(self, f"q_{name}", nn.Linear(dim, dim))
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @classmethod
    def from_config(cls, node, dim):
        """The generator of a RAda trainer node's settings for features of size ``dim``."""
        return cls(dim, **attention_options(node, dim))

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
        text_query = self.text_query(class_features, scale)
        return images_in_chunks(
            lambda images: torch.relu(1 + self.delta(images, class_features, text_query, scale)),
            image_features, self.images_per_chunk(class_features.shape[0]) or image_features.shape[0],
        )

    def images_per_chunk(self, num_classes):
        """Images per chunk for K = ``num_classes`` (CHUNK_SIZE, or the AUTO_CHUNK_ELEMENTS bound)."""
        if self.chunk_size > 0:
            return self.chunk_size
        return max(1, AUTO_CHUNK_ELEMENTS // (self.num_heads * num_classes * num_classes))

    def text_query(self, class_features, scale):
        """The projected X2 [H, K, dh] (shared by every image), or None without the "text" query."""
        if "text" not in self.queries:
            return None
        return split_heads(self.q_text(scale.sqrt() * class_features), self.num_heads)

    def delta(self, image_features, class_features, text_query, scale):
        """dM [b, K, D] for one chunk of b images; ``text_query`` from :meth:`text_query`."""
        rational = scale * rational_matrix(image_features, class_features)  # [b, K, D]
        key = split_heads(self.key(rational), self.num_heads)  # [b, H, K, dh]
        value = split_heads(self.value(rational), self.num_heads)
        outputs = []
        if "image" in self.queries:
            image_query = split_heads(self.q_image(scale.sqrt() * image_features).unsqueeze(1), self.num_heads)
            # X1 is the same in every class row, so its map has identical rows and the global
            # normalisation (sum over the K x K map, times K) reduces to the row softmax.
            outputs.append(attend(image_query, key, value, "row", self.temperature))  # [b, H, 1, dh]
        if "text" in self.queries:
            text_query = text_query.to(key.dtype).expand(image_features.shape[0], -1, -1, -1)
            outputs.append(attend(text_query, key, value, self.attn_norm, self.temperature))
        if "rational" in self.queries:
            rational_query = split_heads(self.q_rational(rational), self.num_heads)
            outputs.append(attend(rational_query, key, value, self.attn_norm, self.temperature))
        output = outputs[0]
        for other in outputs[1:]:
            output = output + other
        output = (output / len(outputs)).expand_as(value).transpose(1, 2).flatten(2)  # [b, K, D]
        return self.out(output)


class RationalAdapter:
    """RAda's output stage: a mask generator composed with the mask loss.

    A model holding one registers ``generator`` as its own submodule (RAda's models call it
    ``mask_generator``, so checkpoints keep the keys ``mask_generator.*``); this object holds
    no tensors of its own.

    Args:
        generator: a mask generator (``generator(f [B, D], t [K, D], tau) -> M [B, K, D]``,
            M = 1 at initialisation; see :mod:`vlprompt.methods.rada_mask_generators`).
        alpha: weight of the mask regulariser (None: the model only predicts).
        mask_loss: a MASK_LOSSES kind (None: the model only predicts).
    """

    def __init__(self, generator, alpha=None, mask_loss=None):
        self.generator = generator
        self.alpha = alpha
        self.mask_loss = mask_loss

    def __call__(self, image_features, class_features, scale):
        """(logits [B, K], mask [B, K, D]) from normalised [B, D] and [K, D] features and tau."""
        mask = self.generator(image_features, class_features, scale)
        return rational_logits(rational_matrix(image_features, class_features), mask, scale), mask

    def regularised(self, ce, mask):
        """(CE + ALPHA * L_mask, terms) for a CE scalar and a mask [B, K, D]."""
        mask_loss = mask_regularizer(mask, self.mask_loss)
        return ce + self.alpha * mask_loss, {"ce": ce.detach(), "mask_loss": mask_loss.detach()}

    def loss(self, image_features, class_features, scale, labels):
        """(CE + ALPHA * L_mask, logits [B, K], terms) from normalised features, tau and labels [B]."""
        logits, mask = self(image_features, class_features, scale)
        loss, terms = self.regularised(F.cross_entropy(logits, labels), mask)
        return loss, logits, terms
