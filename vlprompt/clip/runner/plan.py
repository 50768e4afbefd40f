"""The per-layer plan: what a method does to one tower, and the bookkeeping of a run.

A :class:`Plan` holds edits and masks addressed by 0-based block index. An edit is a
callable ``edit(x, state) -> x`` on hidden states ``x`` [B, L, D]; it may change L (e.g.
:class:`InsertTokens`) and must report that to the :class:`RunState` it receives, so that
the text tower's pooled positions follow the tokens. Edits never read tensor values back
to the host.

Masks are additive ([L, L] or [heads, L, L]; 0 = allowed, -inf = blocked) and are
broadcast over the batch by the towers (see ``blocks.run_block``).

A parallel branch is a callable ``branch(h) -> [B, L, D]`` run beside block i: it reads
h = ``ln_1`` of the block's input (after the edits there) [B, L, D] and its output is added
to the block's output (MMA's adapters). When the block computes only some rows (a last
block), h and the output hold those rows, [B, R, D].
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Union

import torch

__all__ = ["InsertTokens", "ReplaceTokens", "MapTokens", "Edit", "Plan", "EMPTY_PLAN", "RunState"]


class InsertTokens:
    """Insert ``tokens`` into the sequence.

    Args:
        tokens: [n, D] (shared by the batch) or [B, n, D].
        at: position of the first inserted token; None appends at the end.
        keep_length: drop the last n positions afterwards so the length stays L (text
            padding); an end-of-text token pushed out of the sequence is an error.
    """

    def __init__(self, tokens, at=None, keep_length=False):
        self.tokens, self.at, self.keep_length = tokens, at, keep_length

    def __call__(self, x, state):
        tokens = _batched(self.tokens, x)
        full = state.full_length(x)
        at = full if self.at is None else self.at
        x = torch.cat([x[:, :at], tokens, x[:, at:]], dim=1)
        n = tokens.shape[1]
        state.inserted(at, n)
        if self.keep_length:
            x = x[:, :full]
            state.kept_length(full, n)
        return x


class ReplaceTokens:
    """Overwrite positions ``at .. at+n-1`` with ``tokens`` (negative ``at`` counts
    from the end, e.g. ``at=-n`` for the last n tokens).

    Args:
        tokens: [n, D] (shared by the batch) or [B, n, D].
        at: first position replaced.
    """

    def __init__(self, tokens, at):
        self.tokens, self.at = tokens, at

    def __call__(self, x, state):
        tokens = _batched(self.tokens, x)
        start = self.at if self.at >= 0 else state.full_length(x) + self.at
        stop = start + tokens.shape[1]
        return torch.cat([x[:, :start], tokens, x[:, stop:]], dim=1)


class MapTokens:
    """Apply ``fn(x) -> x`` to the whole sequence [B, L, D] (e.g. re-mixing)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.fn = fn

    def __call__(self, x, state):
        return self.fn(x)


def _batched(tokens, x):
    """Broadcast [n, D] tokens to [B, n, D] in the dtype of ``x``."""
    tokens = tokens.to(dtype=x.dtype)
    if tokens.dim() == 2:
        return tokens.unsqueeze(0).expand(x.shape[0], -1, -1)
    return tokens


Edit = Union[InsertTokens, ReplaceTokens, MapTokens]


@dataclass
class Plan:
    """What a method does to one tower.

    Attributes:
        embed: edits of the embedded sequence before the tower's first fixed step (text:
            token embeddings before the positional embedding; vision: after the positional
            embedding, before ``ln_pre``).
        layers: edits at the input of block i (one edit or a sequence of them).
        masks: additive attention mask of block i, [L, L] or [heads, L, L].
        parallel: a branch beside block i: ``branch(ln_1(x)) -> [B, L, D]`` added to the
            block's output, x + attn(ln_1 x) + mlp(ln_2 x') + branch(ln_1 x).
    """

    embed: Sequence[Edit] = ()
    layers: Dict[int, Union[Edit, Sequence[Edit]]] = field(default_factory=dict)
    masks: Dict[int, torch.Tensor] = field(default_factory=dict)
    parallel: Dict[int, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)

    def first_layer(self, num_layers):
        """Index of the first block the plan acts on: -1 if it edits the embedding,
        ``num_layers`` if it does nothing."""
        if self.embed:
            return -1
        touched = set(self.layers) | set(self.masks) | set(self.parallel)
        return min(touched) if touched else num_layers

    def edits_at(self, index):
        """The edits at the input of block ``index``, as a tuple (empty if none)."""
        edits = self.layers.get(index, ())
        return (edits,) if callable(edits) else tuple(edits)


EMPTY_PLAN = Plan()


@dataclass
class RunState:
    """Bookkeeping of one tower run: what edits (``edit(x, state) -> x``) receive.

    Attributes:
        eot: text: [N] pooled positions, moved by tokens inserted before them (a tower pooled
            at its last position keeps them at the last position).
        last: text: max(eot) as a Python int (tracked without reading the device).
        length: text: length L of the full sequence. Only positions 0..last are
            computed (``x`` may be shorter than L); edits address positions of the full
            sequence. None: ``x`` is the full sequence (image tower).
        pool_last: text: the tower pools the last position of the sequence (bidirectional
            towers such as SigLIP's), wherever tokens are inserted.
        patches: images: position of the first patch token, moved by tokens inserted at or
            before it (rotary positions and average pooling follow the patches).
    """

    eot: Optional[torch.Tensor] = None
    last: Optional[int] = None
    length: Optional[int] = None
    pool_last: bool = False
    patches: Optional[int] = None

    def full_length(self, x):
        """Length of the full sequence that ``x`` [B, L', D] is (a prefix of)."""
        return x.shape[1] if self.length is None else self.length

    def inserted(self, at, n):
        """Account for ``n`` tokens inserted at position ``at``."""
        if self.eot is not None:
            moved = n if self.pool_last else n * (self.eot >= at).long()
            self.eot = self.eot + moved
            self.last = self.last + n if self.pool_last or self.last >= at else self.last
        if self.patches is not None and at <= self.patches:
            self.patches += n
        if self.length is not None:
            self.length += n

    def kept_length(self, full, n):
        """Account for cutting the sequence back to ``full`` positions after inserting ``n``
        tokens (text padding): the pooled positions must stay inside."""
        if self.length is not None:
            self.length = full
        if self.pool_last and self.eot is not None:
            self.eot, self.last = self.eot - n, full - 1
        elif self.last is not None and self.last >= full:
            raise ValueError(
                f"Inserting {n} tokens pushes an end-of-text token out of the context "
                f"length {full}; shorten the sentence (template or class name)."
            )
