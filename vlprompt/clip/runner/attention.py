"""Masked multi-head attention through a frozen CLIP block's own weights.

:func:`attention_block` runs one pre-LN residual block of open_clip
(``ResidualAttentionBlock``: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``) with the
block's fused in-projection and ``out_proj`` used as they are (no re-packed copies), through
``scaled_dot_product_attention``.

Shapes: hidden states ``x`` [B, L, D]; queries, keys and values [B, heads, L, D / heads];
an additive mask [L, L] or [heads, L, L] (0 = allowed, -inf = blocked) broadcast over the
batch, never expanded per sequence. Two savings, both exact for the rows they return:

* ``rows``: only some query rows are wanted (e.g. the pooled token of a last block); keys
  and values still come from all L positions, the MLP runs on R rows. A list of positions
  shared by the batch, or per-sequence positions [B, R] (then the mask's rows are gathered
  to [B, 1 or heads, R, L]).
* ``known``: the block's (q, k, v) of the first N positions were computed before (see
  ``prefix.SharedPrefix``); only positions N.. are normalised and projected.

A parallel branch (``Plan.parallel``, e.g. MMA's adapters) reads the block's normalised input
``ln_1(x)`` [B, L, D] (the rows computed, [B, R, D] with ``rows``) and its output, of the same
shape, is added to the block's output: ``x + attn(ln_1 x) + mlp(ln_2 x') + branch(ln_1 x)``.
"""
import torch
import torch.nn.functional as F

__all__ = ["attention_block", "block_qkv"]


def attention_block(block, x, attn_mask=None, rows=None, known=None, parallel=None):
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
            [B, heads, N, D / heads] (see ``SharedPrefix``); only positions N.. are
            normalised and projected.
        parallel: None, or ``branch(h) -> [B, L', D]`` called on h = ``ln_1`` of the rows the
            block computes ([B, L, D], or [B, R, D] with ``rows``); its output is added to the
            block's output.

    Returns:
        [B, L, D], or [B, R, D] for R ``rows``.
    """
    attn = block.attn
    batch, _, width = x.shape
    heads = attn.num_heads
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    num_known = 0 if known is None else known[0].shape[2]
    if rows is None:
        h = block.ln_1(x[:, num_known:])
        q, k, v = _split_heads(F.linear(h, weight, bias), 3, heads)
        if parallel is not None and num_known:
            h = torch.cat([block.ln_1(x[:, :num_known]), h], dim=1)
    else:
        h = block.ln_1(x[:, num_known:])
        h_rows = _select_rows(h, rows) if known is None else block.ln_1(_select_rows(x, rows))
        (q,) = _split_heads(F.linear(h_rows, weight[:width], None if bias is None else bias[:width]), 1, heads)
        k, v = _split_heads(F.linear(h, weight[width:], None if bias is None else bias[width:]), 2, heads)
        x, h = _select_rows(x, rows), h_rows
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
    x = x + block.ls_2(block.mlp(block.ln_2(x)))
    return x if parallel is None else x + parallel(h)


def block_qkv(block, x):
    """A block's queries, keys and values of ``x`` [B, L, D]: 3 x [B, heads, L, D / heads]."""
    attn = block.attn
    return _split_heads(F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias), 3, attn.num_heads)


def _select_rows(x, rows):
    """x[:, rows] for [B, L, D] and a list of positions or per-sequence positions [B, R]."""
    if torch.is_tensor(rows):
        return x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return x[:, rows]


def _split_heads(projected, parts, heads):
    """[B, L, parts * D] -> ``parts`` tensors [B, heads, L, D / heads]."""
    batch, length, width = projected.shape
    return projected.view(batch, length, parts, heads, width // (parts * heads)).permute(2, 0, 3, 1, 4).unbind(0)


def _select_mask_rows(mask, rows):
    """The query rows of an additive mask [L, L] or [heads, L, L]: [..., R, L] for a list of
    positions, [B, 1 or heads, R, L] for per-sequence positions [B, R]."""
    if not torch.is_tensor(rows):
        return mask[..., rows, :]
    if mask.dim() == 2:
        return mask[rows].unsqueeze(1)
    return mask[:, rows].transpose(0, 1)
