"""The prompted runner: CLIP's frozen towers, run block by block with per-layer edits.

Every method of the project is built on this module. CLIP's two towers are the same
thing: token embeddings -> residual blocks -> a pooled token -> a projection. Methods
differ only in what they do between blocks and inside attention, which a :class:`Plan`
describes:

* ``plan.embed``: edits of the embedded sequence before the tower's first fixed step.
  Text: the token embeddings before the positional embedding is added (CoOp's context
  gets positional embeddings). Vision: the sequence after the positional embedding and
  before ``ln_pre`` (first-layer VPT/IVLP prompts are appended there, without
  positional embedding).
* ``plan.layers[i]``: edits at the input of block ``i`` (0-based block index), e.g.
  deep prompts replacing tokens, DeAR's tokens inserted at layer J and re-mixed after.
* ``plan.masks[i]``: an additive attention mask for block ``i``, shape [heads, L, L] or
  [L, L] (0 = allowed, -inf = blocked), broadcast over the batch and never expanded per
  image. The text tower adds its causal mask to it.

Blocks before the first layer the plan touches run without autograd when their
weights are frozen, and for text the hidden state there is cached per token-id tensor,
so a fixed class list costs its prefix once. ``VisionTower.shared_prefix`` returns an
image prefix together with the next block's q, k, v of it (:class:`SharedPrefix`), for
several runs from that block (DeAR's prompted pass and its regulariser's frozen branch).
The text tower computes only positions 0..max(eot) of a batch: under the causal mask
nothing after the last end-of-text token can reach a pooled token (77 positions hold
sentences of typically 10-25 tokens). Edits still address positions of the full sequence
(``ReplaceTokens(at=-n)``, ``keep_length``), masks may be given for the full length, and
``MapTokens`` functions see the computed part. The frozen weights are used as they are:
attention calls the block's own projections through ``scaled_dot_product_attention``.
"""
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from open_clip.transformer import ResidualAttentionBlock, VisionTransformer

__all__ = [
    "InsertTokens", "ReplaceTokens", "MapTokens", "Plan", "RunState", "TowerOutput",
    "SharedPrefix", "VisionTower", "TextTower", "CLIPRunner", "attention_block", "block_qkv",
    "UnsupportedBackboneError",
]


class UnsupportedBackboneError(NotImplementedError):
    """The open_clip model has a tower layout the runner cannot drive."""


# ----------------------------------------------------------------------------- edits

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
            state.length = None if state.length is None else full
            if state.last is not None and state.last >= full:
                raise ValueError(
                    f"Inserting {n} tokens pushes an end-of-text token out of the context "
                    f"length {full}; shorten the sentence (template or class name)."
                )
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
    """What a method does to one tower (see the module docstring)."""

    embed: Sequence[Edit] = ()
    layers: Dict[int, Union[Edit, Sequence[Edit]]] = field(default_factory=dict)
    masks: Dict[int, torch.Tensor] = field(default_factory=dict)

    def first_layer(self, num_layers):
        """Index of the first block the plan acts on: -1 if it edits the embedding,
        ``num_layers`` if it does nothing."""
        if self.embed:
            return -1
        touched = set(self.layers) | set(self.masks)
        return min(touched) if touched else num_layers

    def edits_at(self, index):
        edits = self.layers.get(index, ())
        return (edits,) if callable(edits) else tuple(edits)


EMPTY_PLAN = Plan()


@dataclass
class RunState:
    """Bookkeeping of one tower run: what edits (``edit(x, state) -> x``) receive.

    Attributes:
        eot: text: [N] pooled positions, moved by tokens inserted before them.
        last: text: max(eot) as a Python int (tracked without reading the device).
        length: text: length L of the full sequence. Only positions 0..last are
            computed (``x`` may be shorter than L); edits address positions of the full
            sequence. None: ``x`` is the full sequence (image tower).
    """

    eot: Optional[torch.Tensor] = None
    last: Optional[int] = None
    length: Optional[int] = None

    def full_length(self, x):
        return x.shape[1] if self.length is None else self.length

    def inserted(self, at, n):
        """Account for ``n`` tokens inserted at position ``at``."""
        if self.eot is not None:
            self.eot = self.eot + n * (self.eot >= at).long()
            self.last = self.last + n if self.last >= at else self.last
        if self.length is not None:
            self.length += n


@dataclass
class TowerOutput:
    """Result of running a tower.

    Attributes:
        features: [N, E] projected pooled features (not normalised).
        tokens: [N, L, D] hidden states after the last block (before the final LN);
            text: positions 0..max(eot) only, [N, max(eot) + 1, D], or the pooled
            tokens [N, 1, D] (see ``TextTower.forward``).
        eot: text only: [N] positions that were pooled.
    """

    features: torch.Tensor
    tokens: torch.Tensor
    eot: Optional[torch.Tensor] = None


@dataclass
class SharedPrefix:
    """The unmodified image tower's state at the input of block ``start``, with that
    block's projections of it, computed once for several runs that start there.

    DeAR's prompted branch (which appends attribute tokens at ``start``) and the frozen
    branch of its regulariser begin with the same N tokens, so block ``start`` normalises
    and projects them once; each run projects only the tokens it adds.

    Attributes:
        hidden: [B, N, D] hidden states at the input of block ``start``.
        start: 0-based index of the first block the runs compute.
        qkv: block ``start``'s (q, k, v) of ``hidden``, each [B, heads, N, D / heads]
            (None when ``start`` is past the last block).
    """

    hidden: torch.Tensor
    start: int
    qkv: Optional[tuple] = None


# ----------------------------------------------------------------------------- blocks

def attention_block(block, x, attn_mask=None, rows=None, known=None):
    """One pre-LN residual block of CLIP with an optional additive attention mask.

    Args:
        block: open_clip ResidualAttentionBlock (frozen weights used as they are).
        x: [B, L, D].
        attn_mask: None, [L, L] or [heads, L, L]; broadcast over the batch.
        rows: None, or the positions whose outputs are wanted: a list of indices shared by
            the batch, or a LongTensor [B, R] of positions per sequence (e.g. each
            sentence's end-of-text token). Keys and values still come from all L
            positions, but queries, residuals and the MLP are computed for those rows only
            (e.g. the pooled token of a last block).
        known: None, or this block's (q, k, v) of the first N positions of ``x``, each
            [B, heads, N, D / heads] (see :class:`SharedPrefix`); only positions N.. are
            normalised and projected.

    Returns:
        [B, L, D], or [B, R, D] for R ``rows``.
    """
    attn = block.attn
    batch, _, width = x.shape
    heads = attn.num_heads
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    num_known = 0 if known is None else known[0].shape[2]
    if rows is None:
        q, k, v = block_qkv(block, x[:, num_known:])
    else:
        h = block.ln_1(x[:, num_known:])
        h_rows = _select_rows(h, rows) if known is None else block.ln_1(_select_rows(x, rows))
        (q,) = _split_heads(F.linear(h_rows, weight[:width], None if bias is None else bias[:width]), 1, heads)
        k, v = _split_heads(F.linear(h, weight[width:], None if bias is None else bias[width:]), 2, heads)
        x = _select_rows(x, rows)
        if attn_mask is not None:
            attn_mask = _select_mask_rows(attn_mask, rows)
    if known is not None:
        k, v = torch.cat([known[1], k], 2), torch.cat([known[2], v], 2)
        if rows is None:
            q = torch.cat([known[0], q], 2)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    out = out.transpose(1, 2).reshape(batch, -1, width)
    x = x + block.ls_1(attn.out_proj(out))
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def block_qkv(block, x):
    """A block's queries, keys and values of ``x`` [B, L, D]: 3 x [B, heads, L, D / heads]."""
    attn = block.attn
    return _split_heads(F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias), 3, attn.num_heads)


def _split_heads(projected, parts, heads):
    """[B, L, parts * D] -> ``parts`` tensors [B, heads, L, D / heads]."""
    batch, length, width = projected.shape
    return projected.view(batch, length, parts, heads, width // (parts * heads)).permute(2, 0, 3, 1, 4).unbind(0)


def _select_rows(x, rows):
    """x[:, rows] for [B, L, D] and a list of positions or per-sequence positions [B, R]."""
    if torch.is_tensor(rows):
        return x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return x[:, rows]


def _select_mask_rows(mask, rows):
    """The query rows of an additive mask [L, L] or [heads, L, L]: [..., R, L] for a list of
    positions, [B, 1 or heads, R, L] for per-sequence positions [B, R]."""
    if not torch.is_tensor(rows):
        return mask[..., rows, :]
    if mask.dim() == 2:
        return mask[rows].unsqueeze(1)
    return mask[:, rows].transpose(0, 1)


def _check_blocks(blocks, tower):
    for block in blocks:
        if type(block) is not ResidualAttentionBlock or block.attn.in_proj_weight is None:
            raise UnsupportedBackboneError(
                f"The {tower} tower uses {type(block).__name__} blocks; the prompted runner "
                "supports open_clip's standard ResidualAttentionBlock (OpenAI and LAION ViT "
                "CLIP models)."
            )


class _Tower(nn.Module):
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
            x = attention_block(self.blocks[index], x, mask, rows=last_rows, known=known if index == start else None)
        return x


# ----------------------------------------------------------------------------- vision

class VisionTower(_Tower):
    """CLIP's ViT image tower driven block by block.

    Registers open_clip's own modules and parameters (no copies).
    """

    def __init__(self, visual):
        super().__init__()
        if not isinstance(visual, VisionTransformer):
            raise UnsupportedBackboneError(
                f"The image tower is a {type(visual).__name__}; the prompted runner needs a "
                "ViT CLIP image tower (methods that only need image features can use "
                "CLIPRunner.encode_image_plain)."
            )
        if visual.attn_pool is not None or visual.pool_type != "tok":
            raise UnsupportedBackboneError(
                "The prompted runner supports ViT image towers that pool the class token "
                f"(pool_type 'tok', no attention pooling); got pool_type '{visual.pool_type}'."
            )
        _check_blocks(visual.transformer.resblocks, "image")
        self.conv1 = visual.conv1
        self.class_embedding = visual.class_embedding
        self.positional_embedding = visual.positional_embedding
        self.patch_dropout = visual.patch_dropout
        self.ln_pre = visual.ln_pre
        self.blocks = visual.transformer.resblocks
        self.ln_post = visual.ln_post
        self.proj = visual.proj

    @property
    def output_dim(self):
        return self.proj.shape[1]

    def embed(self, images):
        """Patch + class-token embedding with positional embedding.

        Args:
            images: [B, 3, H, W].
        Returns:
            [B, 1 + P, D], before ``ln_pre``.
        """
        x = self.conv1(images.to(self.conv1.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        return self.patch_dropout(x)

    def stem(self, images, plan=EMPTY_PLAN):
        """Embedding, the plan's embedding edits, and ``ln_pre``: input of block 0."""
        x = self.embed(images)
        for edit in plan.embed:
            x = edit(x, RunState())
        return self.ln_pre(x)

    def project(self, tokens):
        """``ln_post`` then the frozen projection: [..., D] -> [..., E]."""
        return self.ln_post(tokens) @ self.proj

    def forward(self, images=None, plan=EMPTY_PLAN, hidden=None, start=0, rows=None, prefix=None):
        """Encode images, or continue from hidden states.

        Args:
            images: [B, 3, H, W] (when ``hidden`` is None).
            plan: the method's plan.
            hidden: [B, L, D] hidden states at the input of block ``start`` (e.g. a
                prefix shared between a prompted and a frozen branch).
            start: first block to run when ``hidden`` is given.
            rows: None, or the token positions the last block computes, starting with
                the class token 0 (e.g. ``[0]``, or ``[0]`` plus appended prompt tokens):
                the other positions' final states are skipped, which is exact for them.
            prefix: a SharedPrefix to continue from (instead of ``hidden`` and ``start``);
                the plan's edits at ``prefix.start`` must keep its N tokens first.

        Returns:
            TowerOutput with features [B, E] (class token) and final tokens ([B, L, D],
            or [B, R, D] in the order of ``rows``).
        """
        if rows is not None and (len(rows) == 0 or int(rows[0]) != 0):
            raise ValueError(f"rows must start with the class token position 0, got {list(rows)}.")
        known = None
        if prefix is not None:
            _check_shared_prefix_edits(prefix, plan, hidden)
            hidden, start, known = prefix.hidden, prefix.start, prefix.qkv
        elif hidden is None:
            first = plan.first_layer(self.num_layers)
            if first < 0:
                hidden = self.stem(images, plan)
            else:
                hidden = self.run_prefix(images, first)
                start = first
        x = self.run_blocks(hidden, start, self.num_layers, plan, rows=rows, known=known)
        return TowerOutput(features=self.project(x[:, 0]), tokens=x)

    def run_prefix(self, images, stop):
        """Hidden states at the input of block ``stop`` of the unmodified tower.

        Runs without autograd when the prefix weights are frozen.
        """
        stop = min(stop, self.num_layers)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self._prefix_frozen(stop)):
            return self.run_blocks(self.stem(images), 0, stop)

    def shared_prefix(self, images, start):
        """``run_prefix`` plus block ``start``'s q, k, v of it: a SharedPrefix for several
        runs from ``start`` (no autograd when the weights up to that block are frozen)."""
        hidden = self.run_prefix(images, start)
        if start >= self.num_layers:
            return SharedPrefix(hidden, start)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self._prefix_frozen(start + 1)):
            return SharedPrefix(hidden, start, block_qkv(self.blocks[start], hidden))

    def _prefix_frozen(self, stop):
        return not any(p.requires_grad for p in self._stem_parameters()) and not any(
            p.requires_grad for block in self.blocks[:stop] for p in block.parameters()
        )

    def _stem_parameters(self):
        yield from self.conv1.parameters()
        yield self.class_embedding
        yield self.positional_embedding
        yield from self.ln_pre.parameters()


def _check_shared_prefix_edits(prefix, plan, hidden):
    """A run from a SharedPrefix may only append tokens at its block (the known q, k, v
    are those of the prefix's N tokens at positions 0..N-1)."""
    if hidden is not None:
        raise ValueError("Give the image tower hidden states or a SharedPrefix, not both.")
    num_known = prefix.hidden.shape[1]
    for edit in plan.edits_at(prefix.start):
        if not (isinstance(edit, InsertTokens) and (edit.at is None or edit.at >= num_known)):
            raise ValueError(
                f"A run from a SharedPrefix at block {prefix.start} may only insert tokens after its "
                f"{num_known} tokens there (InsertTokens at the end); got {type(edit).__name__}, which "
                "would change tokens whose projections the prefix holds."
            )


# ----------------------------------------------------------------------------- text

def _pooled_rows(state):
    """Per-sentence rows [N, 1] of the pooled tokens (``run_blocks`` rows)."""
    return state.eot.unsqueeze(1)


class TextTower(_Tower):
    """CLIP's text tower driven block by block, with a cached frozen prefix.

    Args:
        clip_model: an open_clip ``CLIP`` (text modules on the model itself).
        cache_size: number of (token ids, layer) prefixes kept.
    """

    def __init__(self, clip_model, cache_size=16):
        super().__init__()
        if not hasattr(clip_model, "token_embedding") or not hasattr(clip_model, "transformer"):
            raise UnsupportedBackboneError(
                f"{type(clip_model).__name__} has no built-in CLIP text transformer (e.g. a "
                "Hugging Face text tower); the prompted runner supports open_clip CLIP models."
            )
        pool_type = getattr(clip_model, "text_pool_type", "argmax")
        if pool_type not in ("argmax", "eos"):
            raise UnsupportedBackboneError(
                f"Text pooling '{pool_type}' is not supported by the prompted runner "
                "(supported: 'argmax', 'eos')."
            )
        _check_blocks(clip_model.transformer.resblocks, "text")
        self.token_embedding = clip_model.token_embedding
        self.positional_embedding = clip_model.positional_embedding
        self.blocks = clip_model.transformer.resblocks
        self.ln_final = clip_model.ln_final
        self.text_projection = clip_model.text_projection
        self.register_buffer("attn_mask", clip_model.attn_mask, persistent=False)
        self.pool_type = pool_type
        self.eos_token_id = getattr(clip_model, "text_eos_id", None)
        self.cache_size = cache_size
        self._prefix_cache = OrderedDict()

    @property
    def context_length(self):
        return self.positional_embedding.shape[0]

    @property
    def output_dim(self):
        proj = self.text_projection
        return proj.out_features if isinstance(proj, nn.Linear) else proj.shape[1]

    def eot_positions(self, token_ids):
        """Positions of the pooled (end-of-text) token: [N] from ids [N, L]."""
        if self.pool_type == "argmax":
            return token_ids.argmax(dim=-1)
        return (token_ids == self.eos_token_id).int().argmax(dim=-1)

    def base_mask(self, length, device):
        if self.attn_mask is None:
            return None
        if length <= self.attn_mask.shape[0]:
            return self.attn_mask[:length, :length]
        return torch.full((length, length), float("-inf"), device=device).triu_(1)

    def embed(self, token_ids):
        """Token embeddings [N, L, D] (no positional embedding)."""
        return self.token_embedding(token_ids)

    def project(self, tokens):
        """``ln_final`` then the projection: [..., D] -> [..., E]."""
        x = self.ln_final(tokens)
        if isinstance(self.text_projection, nn.Linear):
            return self.text_projection(x)
        return x @ self.text_projection

    def forward(self, token_ids=None, plan=EMPTY_PLAN, embeddings=None, eot=None, all_tokens=False):
        """Encode sentences.

        Args:
            token_ids: [N, L] token ids (also give the pooled positions unless
                ``eot`` is given).
            plan: the method's plan.
            embeddings: [N, L, D] token embeddings built by a method (e.g. CoOp's
                prefix + context + suffix); replaces ``embed(token_ids)``.
            eot: [N] pooled positions of ``embeddings`` (required with embeddings).
            all_tokens: compute every position in the last block; by default it computes
                only the pooled token of each sentence (exact for the features).

        Returns:
            TowerOutput with features [N, E], the pooled positions (moved by tokens
            inserted before them) and the final tokens: [N, max(eot) + 1, D] with
            ``all_tokens`` (or when the plan leaves all blocks to the cached prefix),
            else the pooled tokens [N, 1, D].
        """
        if embeddings is None and token_ids is None:
            raise ValueError("TextTower needs token_ids or embeddings.")
        state = self._state(token_ids if embeddings is None else embeddings,
                            self.eot_positions(token_ids) if eot is None else eot)
        first = plan.first_layer(self.num_layers)
        if embeddings is not None or first < 0:
            x = self.embed(token_ids) if embeddings is None else embeddings
            for edit in plan.embed:
                x = edit(x, state)
            x = x[:, : state.last + 1]
            x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
            start = 0
        else:
            x = self.prefix(token_ids, first, state.last)
            start = first
        if all_tokens or start == self.num_layers:
            x = self.run_blocks(x, start, self.num_layers, plan, state)
            pooled = x[torch.arange(x.shape[0], device=x.device), state.eot]
        else:
            x = self.run_blocks(x, start, self.num_layers, plan, state, rows=_pooled_rows)
            pooled = x[:, 0]
        return TowerOutput(features=self.project(pooled), tokens=x, eot=state.eot)

    @staticmethod
    def _state(sequence, eot):
        """Run state of a batch: pooled positions [N], their maximum, the full length L.

        Meta tensors (models built for their shapes only) have no values: every position
        is kept.
        """
        last = int(eot.max()) if eot.numel() and not eot.is_meta else sequence.shape[1] - 1
        return RunState(eot=eot, last=last, length=sequence.shape[1])

    def prefix(self, token_ids, stop, last=None):
        """Hidden states [N, last + 1, D] at the input of block ``stop`` of the unmodified
        tower (``last``: the last position needed; default: the last end-of-text token).

        Cached per (token ids, stop, last, device, autocast dtype) while the prefix is
        frozen, so a fixed class list pays for layers below ``stop`` once.
        """
        stop = min(stop, self.num_layers)
        frozen = not self.token_embedding.weight.requires_grad and not any(
            p.requires_grad for block in self.blocks[:stop] for p in block.parameters()
        )
        if not frozen:
            return self._compute_prefix(token_ids, stop, last)
        device_type = token_ids.device.type
        autocast_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        key = (stop, last, str(token_ids.device), autocast_dtype, tuple(token_ids.shape),
               hash(token_ids.cpu().numpy().tobytes()))
        if key in self._prefix_cache:
            self._prefix_cache.move_to_end(key)
            return self._prefix_cache[key]
        with torch.no_grad():
            hidden = self._compute_prefix(token_ids, stop, last)
        self._prefix_cache[key] = hidden
        if len(self._prefix_cache) > self.cache_size:
            self._prefix_cache.popitem(last=False)
        return hidden

    def _compute_prefix(self, token_ids, stop, last=None):
        state = self._state(token_ids, self.eot_positions(token_ids))
        state.last = state.last if last is None else last
        x = self.embed(token_ids)[:, : state.last + 1]
        x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
        return self.run_blocks(x, 0, stop, state=state)

    def clear_cache(self):
        """Forget cached prefixes (call after changing the frozen weights in place)."""
        self._prefix_cache.clear()

    def _apply(self, fn, *args, **kwargs):
        self.clear_cache()
        return super()._apply(fn, *args, **kwargs)


# ----------------------------------------------------------------------------- model

class CLIPRunner(nn.Module):
    """A frozen open_clip CLIP model seen as two prompted towers plus a logit scale.

    Attributes:
        visual: VisionTower (None for non-ViT image towers; see encode_image_plain).
        text: TextTower.
        logit_scale: CLIP's learned log temperature (frozen).
    """

    def __init__(self, clip_model):
        super().__init__()
        try:
            self.visual = VisionTower(clip_model.visual)
        except UnsupportedBackboneError:
            self.visual = None
            self.plain_visual = clip_model.visual
        self.text = TextTower(clip_model)
        self.logit_scale = clip_model.logit_scale

    @property
    def dtype(self):
        return self.logit_scale.dtype

    def encode_image_plain(self, images):
        """Image features [B, E] of the unmodified tower (any open_clip image tower).

        The last block of a ViT computes the class token only (``rows=[0]``; exact).
        """
        if self.visual is None:
            return self.plain_visual(images)
        return self.visual(images, rows=[0]).features

    def encode_image(self, images, plan=EMPTY_PLAN):
        """Image features [B, E] (not normalised); the last block computes the class token only."""
        if self.visual is None:
            if plan is not EMPTY_PLAN:
                raise UnsupportedBackboneError("Prompted image encoding needs a ViT CLIP image tower.")
            return self.plain_visual(images)
        return self.visual(images, plan, rows=[0]).features

    def encode_text(self, token_ids, plan=EMPTY_PLAN):
        """Text features [N, E] (not normalised)."""
        return self.text(token_ids, plan).features
