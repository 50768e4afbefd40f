"""What the two towers share: the block loop under a plan, and the tower output.

:class:`Tower` runs blocks ``start .. stop-1`` of a stack of open_clip
``ResidualAttentionBlock`` s on hidden states [N, L, D], applying the plan's edits at each
block's input, adding the plan's mask ([L, L] or [heads, L, L]) to the tower's own mask
(the text tower's causal mask; none for images) and the plan's parallel branch to the
block's output. Subclasses give ``blocks`` and
``base_mask``.
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .attention import attention_block
from .plan import EMPTY_PLAN, RunState

__all__ = ["UnsupportedBackboneError", "TowerOutput", "Tower", "check_blocks"]


class UnsupportedBackboneError(NotImplementedError):
    """The open_clip model has a tower layout the runner cannot drive."""


@dataclass
class TowerOutput:
    """Result of running a tower.

    Attributes:
        features: [N, E] projected pooled features (not normalised).
        tokens: [N, L, D] hidden states after the last block (before the final LN), or
            only the rows the last block computed ([N, R, D]; see the towers' ``forward``);
            text: positions 0..max(eot) only, [N, max(eot) + 1, D], or the pooled tokens
            [N, 1, D].
        eot: text only: [N] positions that were pooled.
    """

    features: torch.Tensor
    tokens: torch.Tensor
    eot: Optional[torch.Tensor] = None


def check_blocks(blocks, tower):
    """Raise UnsupportedBackboneError unless every block is a standard open_clip
    ResidualAttentionBlock with a fused in-projection (what ``attention_block`` drives)."""
    from open_clip.transformer import ResidualAttentionBlock

    for block in blocks:
        if type(block) is not ResidualAttentionBlock or block.attn.in_proj_weight is None:
            raise UnsupportedBackboneError(
                f"The {tower} tower uses {type(block).__name__} blocks; the prompted runner "
                "supports open_clip's standard ResidualAttentionBlock (OpenAI and LAION ViT "
                "CLIP models)."
            )


class Tower(nn.Module):
    """Shared block loop of the two towers."""

    blocks: nn.ModuleList

    @property
    def num_layers(self):
        return len(self.blocks)

    @property
    def num_heads(self):
        return self.blocks[0].attn.num_heads

    @property
    def width(self):
        return self.blocks[0].attn.embed_dim

    def base_mask(self, length, device):
        """The tower's own additive mask for a sequence of ``length`` (None: no mask)."""
        return None

    def run_blocks(self, x, start, stop, plan=EMPTY_PLAN, state=None, rows=None, known=None):
        """Run blocks ``start .. stop-1`` with the plan's edits and masks.

        Args:
            x: [N, L, D] hidden states at the input of block ``start``.
            state: text: the run's pooled positions; each block then computes only
                positions 0..state.last (with the causal mask nothing after the last
                end-of-text token can reach a pooled token), and masks given for the full
                sequence are cut to that length.
            rows: positions whose outputs the last block computes (None: all; see
                ``attention_block``), or a function of the run state giving them after the
                last block's edits.
            known: block ``start``'s (q, k, v) of the first N positions of its input
                after the plan's edits there (``SharedPrefix.qkv``; edits must keep them).
        Returns:
            [N, L', D] hidden states at the input of block ``stop`` ([N, R, D] with rows).
        """
        state = state or RunState()
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
            x = attention_block(self.blocks[index], x, mask, rows=last_rows, known=known if index == start else None,
                                parallel=plan.parallel.get(index))
        return x
