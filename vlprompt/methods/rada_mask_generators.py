"""RAda's mask generators: a registry and the variants of the paper's ablations (Table 4, supplement Table 10).

Contract of a mask generator (an ``nn.Module`` registered in MASK_GENERATOR_REGISTRY):

* ``generator(image_features, class_features, scale) -> mask`` with normalised image features
  f [B, D], normalised class features t [K, D] (text features or classifier rows, shared by
  the batch) and CLIP's temperature tau (a scalar tensor, never trained: generators detach
  it); the mask M is [B, K, D], M >= 0, and the logits are tau * sum_d M * f_d * t[c, d]
  (:class:`vlprompt.methods.rada_rational.RationalAdapter`);
* M = 1 exactly at initialisation (the last projection starts at zero), so a fresh RAda
  model is zero-shot CLIP;
* ``cls.from_config(node, dim)`` builds it from a RAda trainer node (``TRAINER.RADA`` and
  the other RAda trainers' nodes) for features of size ``dim``.

Registered (``TRAINER.<node>.GENERATOR.NAME``):

* ``RationalMaskGenerator`` (default): one multi-query attention layer over the class axis
  (paper Eq. 6); ``GENERATOR.QUERIES`` keeps a subset of the queries (Table 4);
* ``StackedRationalMaskGenerator``: ``GENERATOR.NUM_LAYERS`` attention layers (supplement,
  Table 10): layer 1 is the default generator; each further layer attends with the mask of
  the layers before it as query and tau R as key and value, and adds its output to theirs;
* ``MLPMaskGenerator``: an MLP applied to each class's rational row alone (Table 4, "MLP for
  g"): the classes do not interact.
"""
import torch
from torch import nn

from vlprompt.config import ConfigError
from vlprompt.utils import Registry

from .rada_rational import (
    QUERY_INPUTS, RationalMaskGenerator, attend, attention_options, check_queries, images_in_chunks, rational_matrix,
    split_heads,
)

__all__ = [
    "MASK_GENERATOR_REGISTRY", "MLPMaskGenerator", "MaskQueryAttention", "StackedRationalMaskGenerator",
    "build_mask_generator", "check_generator_node",
]

MASK_GENERATOR_REGISTRY = Registry("MASK_GENERATOR")
MASK_GENERATOR_REGISTRY.register(RationalMaskGenerator)  # the paper's generator (default)


@MASK_GENERATOR_REGISTRY.register()
class MLPMaskGenerator(nn.Module):
    """dM[b, c] = W2 ReLU(W1 (tau R[b, c]) + b1) + b2, for every class row independently.

    The paper's "MLP for g" (Table 4) replaces the attention layer by an MLP and notes that
    it "can only process different classes independently"; its input is what the attention
    layer attends over, the rational row tau R_c = tau f * t_c (which holds both f and t_c).
    Two D x D layers (hidden width D); the second starts at zero, so M = 1 at first.

    Args:
        dim: feature size D.
    """

    def __init__(self, dim):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @classmethod
    def from_config(cls, node, dim):
        return cls(dim)

    def forward(self, image_features, class_features, scale):
        """M = ReLU(1 + dM) [B, K, D] from f [B, D], t [K, D] and tau."""
        rational = scale.detach() * rational_matrix(image_features, class_features)
        return torch.relu(1 + self.out(torch.relu(self.hidden(rational))))


class MaskQueryAttention(nn.Module):
    """One further attention layer of the stacked generator: query W_q M, key W_k (tau R),
    value W_v (tau R), attention over the class axis per head, then W_o (zero at first).

    Args:
        dim: D. num_heads: H. attn_norm, temperature: as for RationalMaskGenerator.
    """

    def __init__(self, dim, num_heads, attn_norm, temperature):
        super().__init__()
        self.num_heads, self.attn_norm, self.temperature = num_heads, attn_norm, float(temperature)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, mask, rational):
        """This layer's dM [b, K, D] from the previous mask [b, K, D] and tau R [b, K, D]."""
        query = split_heads(self.query(mask), self.num_heads)
        key = split_heads(self.key(rational), self.num_heads)
        value = split_heads(self.value(rational), self.num_heads)
        output = attend(query, key, value, self.attn_norm, self.temperature)  # [b, H, K, dh]
        return self.out(output.transpose(1, 2).flatten(2))


@MASK_GENERATOR_REGISTRY.register()
class StackedRationalMaskGenerator(nn.Module):
    """L attention layers with residual masks (supplement, Appendix H and Table 10).

    dM_1 = the default generator's dM (paper Eq. 6); for l = 2..L,
    dM_l = dM_{l-1} + layer_l(query = M_{l-1}, key = value = tau R), with M_l = ReLU(1 + dM_l):
    each layer's query is the combined mask of all layers before it, key and value stay the
    rational matrix, and the final mask M_L combines every layer's output. Every layer's W_o
    starts at zero, so M = 1 at first; with L = 1 this is RationalMaskGenerator (same
    parameters drawn in the same order, same mask).

    Args:
        dim: D. num_layers: L >= 1. The other arguments: RationalMaskGenerator's (the chunk
            size is computed as for one layer: the layers of a chunk run one after another).
    """

    def __init__(self, dim, num_layers, num_heads=8, attn_norm="row", temperature=1.0, chunk_size=0,
                 queries=QUERY_INPUTS):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"The stacked mask generator needs at least one layer, got {num_layers}.")
        self.first = RationalMaskGenerator(dim, num_heads, attn_norm, temperature, chunk_size, queries)
        self.layers = nn.ModuleList(
            MaskQueryAttention(dim, num_heads, attn_norm, temperature) for _ in range(num_layers - 1)
        )

    @classmethod
    def from_config(cls, node, dim):
        return cls(dim, node.GENERATOR.NUM_LAYERS, **attention_options(node, dim))

    def forward(self, image_features, class_features, scale):
        """M_L [B, K, D] from f [B, D], t [K, D] and tau."""
        scale = scale.detach()
        text_query = self.first.text_query(class_features, scale)

        def chunk_mask(images):
            delta = self.first.delta(images, class_features, text_query, scale)
            rational = scale * rational_matrix(images, class_features)
            for layer in self.layers:
                delta = delta + layer(torch.relu(1 + delta), rational)
            return torch.relu(1 + delta)

        chunk = self.first.images_per_chunk(class_features.shape[0]) or image_features.shape[0]
        return images_in_chunks(chunk_mask, image_features, chunk)


def check_generator_node(node, name):
    """Raise ConfigError for invalid ``node.GENERATOR`` keys (``name``: the node's name in messages)."""
    generator = node.GENERATOR
    if generator.NAME not in MASK_GENERATOR_REGISTRY:
        raise ConfigError(
            f"{name}.GENERATOR.NAME '{generator.NAME}' is not a registered mask generator; registered: "
            f"{MASK_GENERATOR_REGISTRY.registered_names()}."
        )
    try:
        check_queries(generator.QUERIES)
    except ValueError as error:
        raise ConfigError(f"{name}.GENERATOR.QUERIES: {error}") from None
    if generator.NUM_LAYERS < 1:
        raise ConfigError(f"{name}.GENERATOR.NUM_LAYERS must be >= 1, got {generator.NUM_LAYERS}.")


def build_mask_generator(node, dim):
    """The mask generator named by ``node.GENERATOR.NAME`` for features of size ``dim``."""
    check_generator_node(node, "the RAda node")
    return MASK_GENERATOR_REGISTRY.get(node.GENERATOR.NAME).from_config(node, dim)
