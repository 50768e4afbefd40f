"""CLIP's text tower driven block by block under a plan, with a cached frozen prefix.

Token ids [N, L] (or embeddings [N, L, D] built by a method, e.g. CoOp's context) ->
token embeddings -> the plan's embedding edits -> + positional embedding -> blocks under
the causal mask [L, L] (plus the plan's masks) -> the pooled end-of-text token of each
sentence -> ``ln_final`` and the projection [N, E].

Only positions 0..max(eot) of a batch are computed: under the causal mask nothing after
the last end-of-text token can reach a pooled token (77 positions hold sentences of
typically 10-25 tokens). Edits still address positions of the full sequence
(``ReplaceTokens(at=-n)``, ``keep_length``), masks may be given for the full length, and
``MapTokens`` functions see the computed part. Blocks below the first one the plan touches
are frozen for a fixed class list: their output is cached per token ids (``prefix``); a
method may continue from rows of such a prefix (``forward(token_ids, hidden=..., start=...)``,
e.g. for a subset of the classes).
"""
import torch
from torch import nn

from .blocks import OpenCLIPBlockOps
from .plan import EMPTY_PLAN, RunState
from .prefix import HostValues, PrefixCache, content_digest
from .tower import Tower, TowerOutput, UnsupportedBackboneError, open_clip_blocks

__all__ = ["TextTower"]

POOLINGS = ("argmax", "eos", "last", "first")


def _pooled_rows(state):
    """Per-sentence rows [N, 1] of the pooled tokens (``run_blocks`` rows)."""
    return state.eot.unsqueeze(1)


class TextTower(Tower):
    """CLIP's text tower driven block by block, with a cached frozen prefix.

    Args:
        text: the module holding open_clip's text transformer: an open_clip ``CLIP`` (OpenAI
            layout: the text modules on the model) or a ``TextTransformer`` (``CustomTextCLIP.text``:
            SigLIP, EVA02, PE-Core).
        cache_size: number of (token ids, layer) prefixes kept.

    Pooling: ``argmax`` (the highest token id: CLIP's end-of-text token), ``eos`` (the first
    end-of-sequence token), ``last`` (the last position of the sequence: SigLIP's
    bidirectional tower) or ``first``. A causal tower computes positions 0..max(pooled) only; a
    bidirectional one computes them all.
    """

    ops = OpenCLIPBlockOps()

    def __init__(self, text, cache_size=16):
        super().__init__()
        if not hasattr(text, "token_embedding") or not hasattr(text, "transformer"):
            raise UnsupportedBackboneError(
                f"{type(text).__name__} is not an open_clip text transformer (e.g. a Hugging Face text "
                "tower); the prompted runner drives open_clip's TextTransformer."
            )
        pool_type = getattr(text, "text_pool_type", getattr(text, "pool_type", "argmax"))
        if pool_type not in POOLINGS:
            raise UnsupportedBackboneError(
                f"Text pooling '{pool_type}' is not supported by the prompted runner (supported: {list(POOLINGS)})."
            )
        if getattr(text, "cls_emb", None) is not None or getattr(text, "use_pad_mask", False):
            raise UnsupportedBackboneError(
                "The text tower appends a class token or masks padding (CoCa-style); the prompted runner "
                "drives towers that pool a token of the sentence."
            )
        blocks = open_clip_blocks(text.transformer, "text")
        self.token_embedding = text.token_embedding
        self.positional_embedding = text.positional_embedding
        self.blocks = blocks
        self.ln_final = text.ln_final
        self.text_projection = text.text_projection
        self.register_buffer("attn_mask", text.attn_mask, persistent=False)
        self.pool_type = pool_type
        self.eos_token_id = getattr(text, "text_eos_id", getattr(text, "eos_id", None))
        self._prefix_cache = PrefixCache(cache_size)
        self._host_values = HostValues(cache_size)

    @property
    def causal(self):
        """Whether each position attends to the positions before it only."""
        return self.attn_mask is not None

    @property
    def context_length(self):
        return self.positional_embedding.shape[0]

    @property
    def output_dim(self):
        proj = self.text_projection
        if proj is None:
            return self.width
        return proj.out_features if isinstance(proj, nn.Linear) else proj.shape[1]

    def eot_positions(self, token_ids):
        """Positions of the pooled token: [N] from ids [N, L]."""
        if self.pool_type == "argmax":
            return token_ids.argmax(dim=-1)
        if self.pool_type == "eos":
            return (token_ids == self.eos_token_id).int().argmax(dim=-1)
        position = token_ids.shape[1] - 1 if self.pool_type == "last" else 0
        return torch.full(token_ids.shape[:1], position, dtype=torch.long, device=token_ids.device)

    def base_mask(self, length, device):
        """The causal mask [length, length] (None if the model has none)."""
        if self.attn_mask is None:
            return None
        if length <= self.attn_mask.shape[0]:
            return self.attn_mask[:length, :length]
        return torch.full((length, length), float("-inf"), device=device).triu_(1)

    def head_parameters(self):
        """Parameters after the last block: ``ln_final``, then the projection's."""
        yield from self.ln_final.parameters()
        projection = self.text_projection
        if isinstance(projection, nn.Module):
            yield from projection.parameters()
        elif projection is not None:
            yield projection

    def embed(self, token_ids):
        """Token embeddings [N, L, D] (no positional embedding)."""
        return self.token_embedding(token_ids)

    def project(self, tokens):
        """``ln_final`` then the projection: [..., D] -> [..., E]."""
        x = self.ln_final(tokens)
        if self.text_projection is None:
            return x
        if isinstance(self.text_projection, nn.Linear):
            return self.text_projection(x)
        return x @ self.text_projection

    def forward(self, token_ids=None, plan=EMPTY_PLAN, embeddings=None, eot=None, all_tokens=False, hidden=None,
                start=0, last=None):
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
            hidden: [N, L', D] hidden states at the input of block ``start`` of the
                sentences ``token_ids`` (e.g. rows of ``prefix(token_ids, start)``), at
                least up to their last pooled position; the tower continues from there.
            start: first block to run when ``hidden`` is given.
            last: the last position to compute, at least the largest pooled position (default: that
                position, read from the device once per ``eot`` or ``token_ids`` tensor): a method
                whose sentences change per step (a batch's captions) gives a bound it knows.

        Returns:
            TowerOutput with features [N, E], the pooled positions (moved by tokens
            inserted before them) and the final tokens: [N, max(eot) + 1, D] with
            ``all_tokens``, else the pooled tokens [N, 1, D].
        """
        if embeddings is None and token_ids is None:
            raise ValueError("TextTower needs token_ids or embeddings.")
        if hidden is not None and (embeddings is not None or token_ids is None):
            raise ValueError(
                "TextTower continues from hidden states with the token_ids they belong to, not embeddings."
            )
        state = self._state(token_ids if embeddings is None else embeddings, eot, token_ids, last)
        first = plan.first_layer(self.num_layers)
        if hidden is not None:
            if not 0 <= start < self.num_layers:
                raise ValueError(
                    f"start must be a block index 0..{self.num_layers - 1} with hidden states, got {start}."
                )
            x = hidden[:, : state.last + 1]
        elif embeddings is not None or first < 0:
            x = self.embed(token_ids) if embeddings is None else embeddings
            for edit in plan.embed:
                x = edit(x, state)
            x = x[:, : state.last + 1]
            x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
            start = 0
        else:
            start = min(first, self.num_layers)
            x = self._frozen(token_ids, start, state.last, pooled=start == self.num_layers and not all_tokens)
        if all_tokens:
            x = self.run_blocks(x, start, self.num_layers, plan, state)
            pooled = x[torch.arange(x.shape[0], device=x.device), state.eot]
        else:  # with every block frozen, ``x`` already holds the pooled tokens
            x = self.run_blocks(x, start, self.num_layers, plan, state, rows=_pooled_rows)
            pooled = x[:, 0]
        return TowerOutput(features=self.project(pooled), tokens=x, eot=state.eot)

    def _state(self, sequence, eot=None, token_ids=None, last=None):
        """Run state of a batch: pooled positions [N] (``eot``, else those of
        ``token_ids``; a tower pooled at its last position pools L-1 whatever ``eot`` says), their
        maximum (or ``last``, a bound the caller knows), and the full length L of ``sequence`` [N, L(, D)].

        The maximum is read from the device once per ``eot`` or ``token_ids`` tensor (see
        HostValues). Meta tensors (models built for their shapes only) have no values:
        every position is kept.
        """
        source = token_ids if eot is None else eot
        pool_last = self.pool_type == "last"
        if pool_last:  # the last position, whatever a method's embeddings moved
            eot = torch.full(sequence.shape[:1], sequence.shape[1] - 1, dtype=torch.long, device=sequence.device)
        elif eot is None:
            eot = self.eot_positions(token_ids)
        if last is None and self.causal and eot.numel() and not eot.is_meta:
            last = self._host_values.get(source, "last", lambda _: int(eot.max()))
        elif last is None:  # a bidirectional tower computes every position (as do shape-only meta tensors)
            last = sequence.shape[1] - 1
        return RunState(eot=eot, last=last, length=sequence.shape[1], pool_last=pool_last)

    def prefix(self, token_ids, stop, last=None):
        """Hidden states [N, last + 1, D] at the input of block ``stop`` of the unmodified
        tower (``last``: the last position needed; default: the last end-of-text token).

        Cached per (token ids, stop, last, device, autocast dtype) while the prefix is
        frozen, so a fixed class list pays for layers below ``stop`` once. The token ids
        are keyed by their content, read from the device once per token-id tensor (and
        again after it is changed in place); a method that passes the same tensor every
        step looks its prefix up without a device-to-host copy.
        """
        return self._frozen(token_ids, min(stop, self.num_layers), last)

    def _frozen(self, token_ids, stop, last=None, pooled=False):
        """``prefix``, or with ``pooled`` (and ``stop`` the number of blocks) the pooled
        tokens [N, 1, D] after the last block, which then computes those rows only."""
        frozen = not self.token_embedding.weight.requires_grad and not any(
            p.requires_grad for block in self.blocks[:stop] for p in block.parameters()
        )
        if not frozen:
            return self._compute_prefix(token_ids, stop, last, pooled)
        device_type = token_ids.device.type
        autocast_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        key = (stop, last, pooled, str(token_ids.device), autocast_dtype, tuple(token_ids.shape),
               self._host_values.get(token_ids, "content", content_digest))

        def compute():
            with torch.no_grad():
                return self._compute_prefix(token_ids, stop, last, pooled)

        return self._prefix_cache.get(key, compute)

    def _compute_prefix(self, token_ids, stop, last=None, pooled=False):
        state = self._state(token_ids, token_ids=token_ids, last=last)
        x = self.embed(token_ids)[:, : state.last + 1]
        x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
        return self.run_blocks(x, 0, stop, state=state, rows=_pooled_rows if pooled else None)

    def clear_cache(self):
        """Forget cached prefixes (call after changing the frozen weights in place)."""
        self._prefix_cache.clear()
        self._host_values.clear()

    def _apply(self, fn, *args, **kwargs):
        self.clear_cache()
        return super()._apply(fn, *args, **kwargs)
