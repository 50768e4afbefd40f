"""One residual block of a frozen tower, run through its own weights with the Plan's edits.

Every family's block is the same pre-norm computation,
``x + ls1(attn(norm1 x))`` then ``x + ls2(mlp(norm2 x))``; the families differ in how the
attention projects (a fused in-projection, a fused ``qkv`` with separate biases, three
projections), whether queries and keys are normalised per head, whether they get rotary
positions, and what follows the attention (a norm, a gate). :class:`BlockOps` states those
differences for one family; :func:`run_block` is the computation they share, with the
runner's additions:

* ``attn_mask``: an additive mask [L, L] or [heads, L, L] (0 = allowed, -inf = blocked),
  broadcast over the batch, never expanded per sequence.
* ``rows``: only some query rows are wanted (e.g. the pooled token of a last block); keys and
  values still come from all L positions, the MLP runs on R rows. A list of positions shared
  by the batch, or per-sequence positions [B, R] (the mask's rows are then gathered to
  [B, 1 or heads, R, L]).
* ``known``: the block's (q, k, v) of the first N positions were computed before (see
  ``prefix.SharedPrefix``); only positions N.. are normalised and projected.
* ``parallel``: a branch reading the block's normalised input ``norm1(x)`` [B, L, D] (the
  rows computed, [B, R, D] with ``rows``), whose output is added to the block's output.
* ``rotary``: the tower's rotary table [L, 2 * head_dim] for this sequence (positions without
  a rotary position hold the identity, see ``RotaryTable``), applied to queries and keys after
  their per-head norm.

Shapes: hidden states [B, L, D]; queries, keys, values [B, heads, L, head_dim].
"""
import torch
import torch.nn.functional as F

__all__ = ["BlockOps", "OpenCLIPBlockOps", "TimmBlockOps", "EvaBlockOps", "run_block", "block_qkv"]


class BlockOps:
    """How one family's residual block computes (frozen weights used as they are)."""

    def num_heads(self, block):
        raise NotImplementedError

    def width(self, block):
        """Residual width D."""
        raise NotImplementedError

    def norm1(self, block, x):
        raise NotImplementedError

    def project(self, block, h, parts):
        """Queries, keys and/or values of normalised inputs ``h`` [B, L, D]: one tensor
        [B, heads, L, head_dim] per letter of ``parts`` ("qkv", "q" or "kv"), queries and
        keys normalised per head where the family does."""
        raise NotImplementedError

    def attention_output(self, block, out, h):
        """The attention branch's output [B, L, D] from the heads' outputs ``out``
        [B, L, heads * head_dim] and the normalised input ``h`` [B, L, D], before layer scale."""
        raise NotImplementedError

    def scale_attention(self, block, y):
        """The attention branch's layer scale."""
        raise NotImplementedError

    def mlp_branch(self, block, x):
        """``ls2(mlp(norm2(x)))`` [B, L, D]."""
        raise NotImplementedError

    def kv_groups(self, block):
        """Query heads per key/value head (grouped-query attention; 1 without)."""
        return 1

    def attention_parts(self, block):
        """(norm, gate, projection) after the heads: the norm over the concatenated heads and
        the gate (modules, or None where the family has none) and the output projection
        (nn.Linear); ``attention_output`` is ``proj(norm(out) * sigmoid(gate(h)))``."""
        raise NotImplementedError


def _split_heads(projected, parts, heads):
    """[B, L, parts * D] -> ``parts`` tensors [B, heads, L, D / heads]."""
    batch, length, width = projected.shape
    return projected.view(batch, length, parts, heads, width // (parts * heads)).permute(2, 0, 3, 1, 4).unbind(0)


def _fused_projection(h, weight, bias, parts, heads):
    """The ``parts`` of a fused [3D, D] in-projection (bias [3D] or None) of ``h`` [B, L, D]."""
    width = weight.shape[0] // 3
    first = "qkv".index(parts[0])
    span = slice(first * width, (first + len(parts)) * width)
    if len(parts) < 3:
        weight, bias = weight[span], None if bias is None else bias[span]
    return _split_heads(F.linear(h, weight, bias), len(parts), heads)


class OpenCLIPBlockOps(BlockOps):
    """open_clip's ``ResidualAttentionBlock`` (OpenAI, LAION, MetaCLIP, DFN towers, text towers):
    ``nn.MultiheadAttention``'s fused in-projection and ``out_proj``, ``ls_1``/``ls_2``."""

    def num_heads(self, block):
        return block.attn.num_heads

    def width(self, block):
        return block.attn.embed_dim

    def norm1(self, block, x):
        return block.ln_1(x)

    def project(self, block, h, parts):
        attn = block.attn
        return _fused_projection(h, attn.in_proj_weight, attn.in_proj_bias, parts, attn.num_heads)

    def attention_output(self, block, out, h):
        return block.attn.out_proj(out)

    def attention_parts(self, block):
        return None, None, block.attn.out_proj

    def scale_attention(self, block, y):
        return block.ls_1(y)

    def mlp_branch(self, block, x):
        return block.ls_2(block.mlp(block.ln_2(x)))


class TimmBlockOps(BlockOps):
    """timm's ``vision_transformer.Block`` with its ``Attention`` (SigLIP, SigLIP2, register ViTs):
    fused ``qkv``, optional per-head q/k norm, optional norm and gate after attention, ``ls1``/``ls2``."""

    def num_heads(self, block):
        return block.attn.num_heads

    def width(self, block):
        return block.attn.proj.out_features

    def norm1(self, block, x):
        return block.norm1(x)

    def project(self, block, h, parts):
        attn = block.attn
        tensors = _fused_projection(h, attn.qkv.weight, attn.qkv.bias, parts, attn.num_heads)
        return _normalise_qk(attn, parts, tensors)

    def attention_output(self, block, out, h):
        attn = block.attn
        out = attn.norm(out)
        if attn.gate is not None:
            out = out * attn.gate(h).sigmoid()
        return attn.proj(out)

    def attention_parts(self, block):
        attn = block.attn
        norm = None if isinstance(attn.norm, torch.nn.Identity) else attn.norm
        return norm, getattr(attn, "gate", None), attn.proj

    def scale_attention(self, block, y):
        return block.ls1(y)

    def mlp_branch(self, block, x):
        return block.ls2(block.mlp(block.norm2(x)))


class EvaBlockOps(TimmBlockOps):
    """timm's ``EvaBlock`` (EVA02, PE-Core) with ``EvaAttention`` or ``AttentionRope``: a fused
    ``qkv`` whose bias is ``q_bias``/``k_bias``/``v_bias``, or three projections (grouped
    key/value heads repeated), per-head q/k norm, rotary positions (by the tower), a norm
    and gate after attention, layer scale ``gamma_1``/``gamma_2``."""

    def project(self, block, h, parts):
        attn = block.attn
        if attn.qkv is not None:
            bias = attn.qkv.bias
            if getattr(attn, "q_bias", None) is not None:
                bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
            tensors = _fused_projection(h, attn.qkv.weight, bias, parts, attn.num_heads)
        else:
            modules = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}
            kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
            heads = {"q": attn.num_heads, "k": kv_heads, "v": kv_heads}
            batch, length, _ = h.shape
            tensors = [modules[part](h).view(batch, length, heads[part], attn.head_dim).transpose(1, 2)
                       for part in parts]
        return _normalise_qk(attn, parts, tensors)

    def kv_groups(self, block):
        return getattr(block.attn, "num_kv_groups", 1)

    def scale_attention(self, block, y):
        return y if block.gamma_1 is None else block.gamma_1 * y

    def mlp_branch(self, block, x):
        y = block.mlp(block.norm2(x))
        return y if block.gamma_2 is None else block.gamma_2 * y


def _normalise_qk(attn, parts, tensors):
    """Apply the attention's per-head ``q_norm``/``k_norm`` to the queries and keys among ``tensors``."""
    norms = {"q": attn.q_norm, "k": attn.k_norm, "v": None}
    return tuple(t if norms[part] is None else norms[part](t) for part, t in zip(parts, tensors))


def run_block(ops, block, x, attn_mask=None, rows=None, known=None, parallel=None, rotary=None):
    """One pre-norm residual block with an optional additive attention mask.

    Args:
        ops: the family's BlockOps. block: the frozen block module.
        x: [B, L, D].
        attn_mask: None, [L, L] or [heads, L, L]; broadcast over the batch.
        rows: None, or the positions whose outputs are wanted: a list of indices shared by the
            batch, or a LongTensor [B, R] of positions per sequence.
        known: None, or this block's (q, k, v) of the first N positions of ``x``, each
            [B, heads, N, head_dim], rotary positions applied.
        parallel: None, or ``branch(h) -> [B, L', D]`` on h = ``norm1`` of the rows computed.
        rotary: None, or a RotaryTable of this sequence.

    Returns:
        [B, L, D], or [B, R, D] for R ``rows``.
    """
    batch = x.shape[0]
    num_known = 0 if known is None else known[0].shape[2]
    h = ops.norm1(block, x[:, num_known:])
    if rows is None:
        q, k, v = ops.project(block, h, "qkv")
        query_positions = None
        if parallel is not None and num_known:
            h = torch.cat([ops.norm1(block, x[:, :num_known]), h], dim=1)
    else:
        h_rows = _select_rows(h, rows) if known is None else ops.norm1(block, _select_rows(x, rows))
        (q,) = ops.project(block, h_rows, "q")
        k, v = ops.project(block, h, "kv")
        query_positions = rows
        x, h = _select_rows(x, rows), h_rows
        if attn_mask is not None:
            attn_mask = _select_mask_rows(attn_mask, rows)
    if rotary is not None:
        q = rotary.apply(q, query_positions, offset=num_known if rows is None else 0).type_as(v)
        k = rotary.apply(k, None, offset=num_known).type_as(v)
    if known is not None:
        k, v = torch.cat([known[1], k], 2), torch.cat([known[2], v], 2)
        if rows is None:
            q = torch.cat([known[0], q], 2)
    groups = ops.kv_groups(block)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    out = out.transpose(1, 2).reshape(batch, out.shape[2], -1)
    x = x + ops.scale_attention(block, ops.attention_output(block, out, h))
    x = x + ops.mlp_branch(block, x)
    return x if parallel is None else x + parallel(h)


def block_qkv(ops, block, x, rotary=None):
    """A block's queries, keys and values of ``x`` [B, L, D]: 3 x [B, heads, L, head_dim],
    rotary positions applied (what ``run_block`` takes as ``known``)."""
    q, k, v = ops.project(block, ops.norm1(block, x), "qkv")
    if rotary is not None:
        q, k = rotary.apply(q).type_as(v), rotary.apply(k).type_as(v)
    return q, k, v


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
