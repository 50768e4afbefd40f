"""Direct contributions of attention heads to CLIP's image representation.

CLIP's image feature is ``ln_post(x_L[CLS]) @ proj``, and the class token's residual
stream after the last block is a sum: its value at the input of a chosen block plus,
for every later block, the attention output (one term per head plus the output
projection's bias) and the MLP output. Treating ``ln_post`` as the linear map it is for
one image once its normalisation statistics are fixed (those of the full representation,
Gandelsman et al., ICLR 2024),

    ln_post(x) = sum_i (c_i - mean(c_i)) / sigma(x) * gamma + beta,    x = sum_i c_i,

turns that sum into an exact decomposition of the image feature in the joint space.
The block loop is the prompted runner's: the prefix comes from
``VisionTower.run_prefix`` and each analysed block is advanced with
``runner.run_block``; this module only splits the class token's attention output
of the same block into heads.
"""
from dataclasses import dataclass
from typing import Tuple

import torch

from vlprompt.clip.runner import VisionTower, run_block

__all__ = ["ImageDecomposition", "decompose_image_features", "class_token_head_outputs"]


@dataclass
class ImageDecomposition:
    """Exact additive decomposition of image features ``f`` [B, E] (see module docstring).

    Attributes:
        layers: 0-based indices of the analysed blocks (n of them, the last n blocks).
        heads: [B, n, H, E] direct contribution of every head of the analysed blocks.
        mlps: [B, n, E] direct contribution of every analysed block's MLP.
        attn_biases: [B, n, E] contribution of every analysed block's attention
            output-projection bias.
        residual: [B, E] contribution of the class token's residual stream at the input
            of the first analysed block (the stem and all earlier blocks).
        ln_bias: [E] ``ln_post``'s shift through ``proj`` (the same for every image).
    """

    layers: Tuple[int, ...]
    heads: torch.Tensor
    mlps: torch.Tensor
    attn_biases: torch.Tensor
    residual: torch.Tensor
    ln_bias: torch.Tensor

    def total(self):
        """The image features [B, E] as the sum of all terms."""
        return (
            self.residual + self.heads.sum(dim=(1, 2)) + self.mlps.sum(dim=1)
            + self.attn_biases.sum(dim=1) + self.ln_bias
        )


def class_token_head_outputs(block, x):
    """Split one block's attention output at the class token (position 0) into heads.

    Mirrors ``runner.run_block``: ``ln_1``, the block's fused in-projection,
    softmax attention with scale head_dim^-0.5, the output projection and ``ls_1``.

    Args:
        block: open_clip ResidualAttentionBlock.
        x: [B, L, D] block input.

    Returns:
        (heads [B, H, D], bias [D]): ``heads.sum(1) + bias`` is the attention branch's
        output at the class token (what the block adds to ``x[:, 0]``).
    """
    attn = block.attn
    h = block.ln_1(x)
    batch, length, width = h.shape
    num_heads = attn.num_heads
    head_dim = width // num_heads
    qkv = torch.nn.functional.linear(h, attn.in_proj_weight, attn.in_proj_bias)
    q, k, v = qkv.view(batch, length, 3, num_heads, head_dim).unbind(dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q[:, 0], k) * head_dim ** -0.5
    values = torch.einsum("bhl,blhd->bhd", scores.softmax(dim=-1), v)
    weight = attn.out_proj.weight.view(width, num_heads, head_dim)
    heads = block.ls_1(torch.einsum("bhd,ehd->bhe", values, weight))
    bias = attn.out_proj.bias
    bias = torch.zeros(width, dtype=h.dtype, device=h.device) if bias is None else bias
    return heads, block.ls_1(bias)


def _ln_post_linear(ln, terms, sigma):
    """``ln``'s linear part with fixed statistics: [B, ..., D] terms -> [B, ..., D].

    Args:
        sigma: [B] standard deviation (with eps) of each image's full representation.
    """
    centred = terms - terms.mean(dim=-1, keepdim=True)
    shape = (-1,) + (1,) * (terms.dim() - 1)
    scaled = centred / sigma.view(shape)
    return scaled if ln.weight is None else scaled * ln.weight


@torch.no_grad()
def decompose_image_features(visual: VisionTower, images, num_layers):
    """Decompose the image features of the last ``num_layers`` blocks.

    Args:
        visual: the runner's VisionTower (frozen CLIP image tower).
        images: [B, 3, H, W] preprocessed images.
        num_layers: how many of the last blocks to analyse (1..depth).

    Returns:
        ImageDecomposition whose ``total()`` equals ``visual(images).features``.
    """
    depth = visual.num_layers
    if not 1 <= num_layers <= depth:
        raise ValueError(f"num_layers must be in 1..{depth} (the image tower's depth), got {num_layers}.")
    first = depth - num_layers
    x = visual.run_prefix(images, first)
    residual = x[:, 0]
    heads, mlps, biases = [], [], []
    for index in range(first, depth):
        block = visual.blocks[index]
        head_out, bias = class_token_head_outputs(block, x)
        middle = x[:, 0] + head_out.sum(dim=1) + bias
        mlps.append(block.ls_2(block.mlp(block.ln_2(middle))))
        heads.append(head_out)
        biases.append(bias.expand_as(middle))
        x = run_block(visual.ops, block, x)

    ln = visual.ln_post
    final = x[:, 0]
    sigma = torch.sqrt(final.var(dim=-1, unbiased=False) + ln.eps)
    proj = visual.proj

    def to_joint(terms):
        return _ln_post_linear(ln, terms, sigma) @ proj

    ln_bias = torch.zeros(final.shape[-1], dtype=final.dtype, device=final.device) if ln.bias is None else ln.bias
    return ImageDecomposition(
        layers=tuple(range(first, depth)),
        heads=to_joint(torch.stack(heads, dim=1)),
        mlps=to_joint(torch.stack(mlps, dim=1)),
        attn_biases=to_joint(torch.stack(biases, dim=1)),
        residual=to_joint(residual),
        ln_bias=ln_bias @ proj,
    )
