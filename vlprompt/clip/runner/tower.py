"""What every tower shares: the block loop under a plan, the token layout, the tower output.

:class:`Tower` runs blocks ``start .. stop-1`` of a stack of frozen residual blocks on hidden
states [N, L, D], applying the plan's edits at each block's input, adding the plan's mask
([L, L] or [heads, L, L]) to the tower's own mask (a causal text tower's; none for images)
and the plan's parallel branch to the block's output. How one block computes is its
family's :class:`~vlprompt.clip.runner.blocks.BlockOps`; a family's tower subclass gives
``blocks``, ``ops``, ``base_mask`` and, for rotary towers, ``rotary_table``.
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .blocks import block_qkv, run_block
from .plan import EMPTY_PLAN, RunState

__all__ = ["UnsupportedBackboneError", "TowerOutput", "TokenLayout", "Tower", "RotaryTable", "check_block_types"]


class UnsupportedBackboneError(NotImplementedError):
    """The open_clip model has a tower layout the runner cannot drive."""


@dataclass
class TowerOutput:
    """Result of running a tower.

    Attributes:
        features: [N, E] projected pooled features (not normalised).
        tokens: [N, L, D] hidden states after the last block (before the final norm), or only
            the rows asked for ([N, R, D]; see the towers' ``forward``); text: positions
            0..max(eot) only, [N, max(eot) + 1, D], or the pooled tokens [N, 1, D].
        eot: text only: [N] positions that were pooled.
    """

    features: torch.Tensor
    tokens: torch.Tensor
    eot: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class TokenLayout:
    """Where an image tower's tokens are, before any edit.

    Attributes:
        prefix_tokens: tokens before the patches (class token, register tokens): 1 for
            OpenAI-style towers, 0 for SigLIP's, 1 + registers for register ViTs. Prompt tokens
            are appended after the patches, or inserted right after the prefix tokens.
        num_patches: P, patch tokens follow the prefix tokens.
        pooling: how the pooled feature is read: "token" (the class token at position 0),
            "avg" (the mean of the patch tokens) or "map" (an attention pool over the
            sequence).
        rotary: whether patch tokens get rotary positions in attention (prefix and prompt
            tokens never do).
    """

    prefix_tokens: int
    num_patches: int
    pooling: str
    rotary: bool = False

    @property
    def length(self):
        """Number of tokens the unmodified tower runs: prefix tokens plus patches."""
        return self.prefix_tokens + self.num_patches


def check_block_types(blocks, allowed, tower):
    """Raise UnsupportedBackboneError unless every block is exactly one of the ``allowed`` classes."""
    for block in blocks:
        if type(block) not in allowed:
            names = ", ".join(cls.__name__ for cls in allowed)
            raise UnsupportedBackboneError(
                f"The {tower} tower uses {type(block).__name__} blocks; the prompted runner drives {names} "
                "blocks in this tower family."
            )


def open_clip_blocks(transformer, tower):
    """The blocks of an open_clip ``Transformer`` (``resblocks``), checked: each an open_clip
    ``ResidualAttentionBlock`` with a fused in-projection (UnsupportedBackboneError otherwise)."""
    from open_clip.transformer import ResidualAttentionBlock

    blocks = transformer.resblocks
    check_block_types(blocks, (ResidualAttentionBlock,), tower)
    if any(block.attn.in_proj_weight is None for block in blocks):
        raise UnsupportedBackboneError(f"The {tower} tower's attention has no fused in-projection.")
    return blocks


class RotaryTable:
    """A rotary-position table for one sequence: [L, 2 * head_dim], sines then cosines, the
    tower's table at the patch positions and the identity (sine 0, cosine 1) elsewhere, so
    prefix and prompt tokens get no rotary position.

    Args:
        patch_table: [P, 2 * head_dim] the tower's rotary embedding of its P patches.
        start: position of the first patch token in the sequence.
        length: L.
        half: timm's ``rotate_half`` layout (else interleaved pairs).
    """

    def __init__(self, patch_table, start, length, half):
        num_patches, size = patch_table.shape
        identity = torch.cat([patch_table.new_zeros(size // 2), patch_table.new_ones(size // 2)])
        self.table = torch.cat([identity.expand(start, -1), patch_table,
                                identity.expand(length - start - num_patches, -1)])
        self.half = half

    def apply(self, x, positions=None, offset=0):
        """Rotate queries or keys ``x`` [B, heads, R, head_dim] at ``positions`` (a list of R
        positions; None: the R positions from ``offset`` on)."""
        from timm.layers import apply_rot_embed_cat

        table = self.table[offset: offset + x.shape[2]] if positions is None else self.table[list(positions)]
        return apply_rot_embed_cat(x, table, half=self.half)


class Tower(nn.Module):
    """Shared block loop of the towers.

    Attributes (set by subclasses):
        blocks: nn.ModuleList of frozen residual blocks.
        ops: the family's BlockOps.
    """

    blocks: nn.ModuleList

    @property
    def num_layers(self):
        return len(self.blocks)

    @property
    def num_heads(self):
        return self.ops.num_heads(self.blocks[0])

    @property
    def width(self):
        return self.ops.width(self.blocks[0])

    def base_mask(self, length, device):
        """The tower's own additive mask for a sequence of ``length`` (None: no mask)."""
        return None

    def rotary_table(self, state, length):
        """The RotaryTable of a sequence of ``length`` in run state ``state`` (None: no rotary positions)."""
        return None

    def block_qkv(self, index, x, state=None):
        """Block ``index``'s queries, keys and values of ``x`` [B, L, D] (3 x [B, heads, L, head_dim])."""
        rotary = self.rotary_table(state or self.initial_state(), x.shape[1])
        return block_qkv(self.ops, self.blocks[index], x, rotary)

    def initial_state(self):
        """The run state of the unmodified tower's sequence."""
        return RunState()

    def run_blocks(self, x, start, stop, plan=EMPTY_PLAN, state=None, rows=None, known=None):
        """Run blocks ``start .. stop-1`` with the plan's edits and masks.

        Args:
            x: [N, L, D] hidden states at the input of block ``start``.
            state: the run's bookkeeping (text: pooled positions; each block then computes
                only positions 0..state.last when the tower is causal, and masks given for the
                full sequence are cut to that length; images: where the patches are).
            rows: positions whose outputs the last block computes (None: all; see
                ``blocks.run_block``), or a function of the run state giving them after the
                last block's edits.
            known: block ``start``'s (q, k, v) of the first N positions of its input after the
                plan's edits there (``SharedPrefix.qkv``; edits must keep them).
        Returns:
            [N, L', D] hidden states at the input of block ``stop`` ([N, R, D] with rows).
        """
        state = state or self.initial_state()
        for index in range(start, stop):
            for edit in plan.edits_at(index):
                x = edit(x, state)
            if state.last is not None:
                x = x[:, : state.last + 1]
            length = x.shape[1]
            mask = self.base_mask(length, x.device)
            extra = plan.masks.get(index)
            if extra is not None:
                if state.length is not None:
                    extra = extra[..., :length, :length]
                mask = extra if mask is None else extra + mask.to(extra.dtype)
            last_rows = (rows(state) if callable(rows) else rows) if index == stop - 1 else None
            x = run_block(self.ops, self.blocks[index], x, mask, rows=last_rows,
                          known=known if index == start else None, parallel=plan.parallel.get(index),
                          rotary=self.rotary_table(state, length))
        return x
