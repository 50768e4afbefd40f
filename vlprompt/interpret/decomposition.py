"""Direct contributions of attention heads to a CLIP model's image representation.

The residual stream of every token is a sum: its value at the input of a chosen block plus,
for every later block, the attention output (one term per head plus a bias term) and the MLP
output. The tower's pooling head reads some positions of the last block's output (the class
token; every token for an attention pool; the patches for average pooling) and, with this
image's statistics frozen, is an affine map of them (``VisionTower.readout``): its norms'
means and deviations are those of the full representation (Gandelsman et al., ICLR 2024),

    norm(x) = sum_i (c_i - mean(c_i)) / sigma(x) * gamma + beta,    x = sum_i c_i,

and an attention pool is linear in its values once its attention weights are fixed. That
turns the sum into an exact decomposition of the image feature in the joint space.

**Direct contribution of a head.** Head h of block b adds a term to the residual stream of
every token; its direct contribution is that term at the positions the head reads, through the
frozen readout:

* class-token towers (OpenAI, EVA02, register ViTs): the term at the class token, through the
  final norm and the projection;
* attention-pool towers (SigLIP, SigLIP2, PE-Core): the term at every token the pool reads,
  through the final norm (each token's statistics), the pool's value projection weighted by
  the pool's attention weights of this image, the pool's output projection and the tower's
  projection. The pool's MLP (a residual inside the pool) is not linear; its output is a term
  of its own in ``constant``, as a block's MLP is.

A head's term is split from its block's attention output with that block's own weights: per
head the heads' outputs before the output projection, through the norm after the heads where
the family has one (statistics frozen), its gate (fixed for the image) and the output
projection, with the block's layer scale. The block loop is the prompted runner's
(``VisionTower.run_prefix`` / ``run_blocks``).
"""
from dataclasses import dataclass
from typing import Tuple

import torch

from vlprompt.clip.runner import VisionTower
from vlprompt.clip.runner.vision import frozen_layer_norm

__all__ = ["ImageDecomposition", "decompose_image_features", "block_head_terms"]


@dataclass
class ImageDecomposition:
    """Exact additive decomposition of image features ``f`` [B, E] (see module docstring).

    Attributes:
        layers: 0-based indices of the analysed blocks (n of them, the last n blocks).
        heads: [B, n, H, E] direct contribution of every head of the analysed blocks.
        mlps: [B, n, E] direct contribution of every analysed block's MLP.
        attn_biases: [B, n, E] contribution of every analysed block's attention bias terms.
        residual: [B, E] contribution of the residual stream at the input of the first
            analysed block (the stem and all earlier blocks).
        constant: [B, E] what the readout adds itself: its norms' shifts and biases, an
            attention pool's MLP output and the projections' biases.
    """

    layers: Tuple[int, ...]
    heads: torch.Tensor
    mlps: torch.Tensor
    attn_biases: torch.Tensor
    residual: torch.Tensor
    constant: torch.Tensor

    def total(self):
        """The image features [B, E] as the sum of all terms."""
        return (
            self.residual + self.heads.sum(dim=(1, 2)) + self.mlps.sum(dim=1)
            + self.attn_biases.sum(dim=1) + self.constant
        )


def block_head_terms(visual, index, x, positions):
    """Split block ``index``'s attention output at ``positions`` into heads.

    Mirrors ``runner.run_block`` without a plan: the block's norm, projections, per-head q/k
    norms, rotary positions, softmax attention with scale head_dim^-0.5, then per head the
    norm after the heads (statistics of the whole output frozen), the gate, the output
    projection and the layer scale.

    Args:
        visual: the runner's VisionTower. x: [B, L, D] block input. positions: the P positions.

    Returns:
        (heads [B, P, H, D], bias [B, P, D]): ``heads.sum(2) + bias`` is the attention branch's
        output at ``positions`` (what the block adds to ``x[:, positions]``).
    """
    ops, block = visual.ops, visual.blocks[index]
    h = ops.norm1(block, x)
    q, k, v = ops.project(block, h, "qkv")
    rotary = visual.rotary_table(visual.initial_state(), x.shape[1])
    if rotary is not None:
        q, k = rotary.apply(q).type_as(v), rotary.apply(k).type_as(v)
    groups = ops.kv_groups(block)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q[:, :, positions] @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2)  # [B, P, H, hd]
    batch, length, heads, head_dim = out.shape
    norm, gate, proj = ops.attention_parts(block)
    slots = torch.zeros(batch, length, heads, heads * head_dim, dtype=out.dtype, device=out.device)
    for head in range(heads):
        slots[:, :, head, head * head_dim:(head + 1) * head_dim] = out[:, :, head]
    concat = out.reshape(batch, length, 1, heads * head_dim)
    normed = frozen_layer_norm(norm, concat) if norm is not None else (lambda t: t)
    base = normed(torch.zeros_like(concat))  # the norm's shift (zero without a norm)
    terms = normed(slots) - base
    if gate is not None:
        scale = gate(h[:, positions]).sigmoid()[:, :, None]
        terms, base = terms * scale, base * scale
    head_terms = torch.nn.functional.linear(terms, proj.weight)
    bias = torch.nn.functional.linear(base[:, :, 0], proj.weight, proj.bias)
    return ops.scale_attention(block, head_terms), ops.scale_attention(block, bias)


@torch.no_grad()
def decompose_image_features(visual: VisionTower, images, num_layers):
    """Decompose the image features of the last ``num_layers`` blocks.

    Args:
        visual: the runner's VisionTower (frozen image tower of any family).
        images: [B, 3, H, W] preprocessed images.
        num_layers: how many of the last blocks to analyse (1..depth).

    Returns:
        ImageDecomposition whose ``total()`` equals ``visual(images).features``.
    """
    depth = visual.num_layers
    if not 1 <= num_layers <= depth:
        raise ValueError(f"num_layers must be in 1..{depth} (the image tower's depth), got {num_layers}.")
    first = depth - num_layers
    inputs = [visual.run_prefix(images, first)]  # each analysed block's input, then the last block's output
    for index in range(first, depth):
        inputs.append(visual.run_blocks(inputs[-1], index, index + 1))
    positions, readout = visual.readout(inputs[-1])
    residual = inputs[0][:, positions]
    heads, mlps, biases = [], [], []
    for index, x in zip(range(first, depth), inputs):
        block = visual.blocks[index]
        head_out, bias = block_head_terms(visual, index, x, positions)
        middle = x[:, positions] + head_out.sum(dim=2) + bias
        mlps.append(visual.ops.mlp_branch(block, middle))
        heads.append(head_out)
        biases.append(bias)

    constant = readout(torch.zeros_like(residual[:, :, None]))  # [B, 1, E]

    def to_joint(terms):  # [B, P, *shape, D] -> [B, *shape, E]
        shape = terms.shape[2:-1]
        flat = terms.reshape(*terms.shape[:2], -1, terms.shape[-1])
        return (readout(flat) - constant).reshape(terms.shape[0], *shape, -1)

    return ImageDecomposition(
        layers=tuple(range(first, depth)),
        heads=to_joint(torch.stack(heads, dim=2)),
        mlps=to_joint(torch.stack(mlps, dim=2)),
        attn_biases=to_joint(torch.stack(biases, dim=2)),
        residual=to_joint(residual[:, :, None])[:, 0],
        constant=constant[:, 0],
    )
