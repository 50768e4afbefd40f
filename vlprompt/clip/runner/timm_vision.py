"""timm image towers inside open_clip's ``TimmModel``: SigLIP/SigLIP2 (``VisionTransformer``
with an attention-pool head and no class token) and EVA02/PE-Core (``Eva``: rotary positions
on the patch tokens, SwiGLU, layer scale, q/k norms where present).

The stem is the trunk's own (``patch_embed`` then ``_pos_embed``: prefix tokens, absolute
positions); the head is the trunk's final ``norm``, its pooling (class token, patch average or
attention pool), ``fc_norm``, the trunk's ``head`` and open_clip's projection head. Prompt
tokens get no rotary position: ``Eva`` rotates the patch tokens only, wherever edits move
them (``RunState.patches``).
"""
import torch
from torch import nn

from .blocks import EvaBlockOps, TimmBlockOps
from .tower import RotaryTable, TokenLayout, UnsupportedBackboneError, check_block_types
from .vision import VisionTower, frozen_layer_norm, take

__all__ = ["TimmVisionTower", "TimmViTVisionTower", "EvaVisionTower"]

POOLINGS = {"token": "token", "avg": "avg", "map": "map"}


class TimmVisionTower(VisionTower):
    """What the timm towers share: checks, the head and the parameter groups.

    Args:
        visual: open_clip ``TimmModel`` (``trunk`` the timm model, ``head`` open_clip's projection).
    """

    def __init__(self, visual):
        super().__init__()
        trunk = visual.trunk
        pooling = "map" if trunk.attn_pool is not None else POOLINGS.get(trunk.global_pool)
        if pooling is None:
            raise UnsupportedBackboneError(
                f"The timm image tower pools with '{trunk.global_pool}'; the prompted runner supports "
                "class-token ('token'), average ('avg') and attention-pool ('map') heads."
            )
        if getattr(trunk, "dynamic_img_size", False):
            raise UnsupportedBackboneError("The timm image tower resizes its positions per image (dynamic_img_size); "
                                           "the prompted runner needs a fixed input size.")
        if not _is_identity(getattr(trunk, "patch_drop", None)):
            raise UnsupportedBackboneError("The timm image tower drops patches (patch_drop_rate > 0), which changes "
                                           "the token layout per image; build it without patch dropout.")
        self.trunk = trunk  # the timm model and open_clip's head, each registered once (no aliases)
        self.head = visual.head
        self.head_steps = [step for step in (trunk.head_drop, trunk.head, *visual.head.children())
                           if not _is_identity(step)]
        self.pool_include_prefix = getattr(trunk, "pool_include_prefix", True)
        self.layout = TokenLayout(prefix_tokens=trunk.num_prefix_tokens, num_patches=trunk.patch_embed.num_patches,
                                  pooling=pooling, rotary=getattr(trunk, "rope", None) is not None)
        with torch.no_grad():  # the head's output width, whatever its steps
            self._output_dim = self._head(next(trunk.parameters()).new_zeros(1, trunk.embed_dim)).shape[-1]

    @property
    def blocks(self):
        return self.trunk.blocks

    @property
    def patch_embed(self):
        return self.trunk.patch_embed

    @property
    def norm(self):
        """The norm after the last block."""
        return self.trunk.norm

    @property
    def attn_pool(self):
        return self.trunk.attn_pool

    @property
    def fc_norm(self):
        return self.trunk.fc_norm

    @property
    def output_dim(self):
        return self._output_dim

    def embed(self, images):
        return self.trunk._pos_embed(self.patch_embed(images.to(self.patch_embed.proj.weight.dtype)))

    def pre_norm(self, x):
        return self.trunk.norm_pre(x)

    def pool(self, x, state, pool_keys=None):
        pooling = self.layout.pooling
        if pooling == "token":
            return self._head(self.norm(x[:, 0]))
        x = self.norm(x)
        if pooling == "avg":
            return self._head(x[:, state.patches: state.patches + self.layout.num_patches].mean(1))
        if pool_keys is not None:
            x = take(x, pool_keys)
        elif not self.pool_include_prefix:
            x = x[:, self.layout.prefix_tokens:]
        return self._head(self.attn_pool(x))

    def token_features(self, tokens, projection=None):
        x = self.norm(tokens)
        if self.attn_pool is not None:
            x = self.attn_pool(x.reshape(-1, 1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        return self._head(x, projection)

    def _head(self, pooled, projection=None):
        """fc_norm, the trunk's head and open_clip's projection of pooled features [..., D]."""
        x = self.fc_norm(pooled)
        final = self._final_linear()
        steps = self.head_steps if projection is None or final is None else self.head_steps[:-1]
        for step in steps:
            x = step(x)
        if projection is None:
            return x
        x = x @ projection
        return x if final is None or final.bias is None else x + final.bias

    def _final_linear(self):
        last = self.head_steps[-1] if len(self.head_steps) else None
        return last if isinstance(last, nn.Linear) else None

    @property
    def projection(self):
        final = self._final_linear()
        return None if final is None else final.weight.t()

    def readout(self, x, state=None):
        state = state or self.initial_state()
        pooling = self.layout.pooling
        if pooling == "token":
            positions = [0]
        elif pooling == "avg":
            positions = list(range(state.patches, state.patches + self.layout.num_patches))
        else:
            first = 0 if self.pool_include_prefix else self.layout.prefix_tokens
            positions = list(range(first, x.shape[1]))
        tokens = x[:, positions]
        norm = frozen_layer_norm(self.norm, tokens[:, :, None])
        if pooling != "map":
            pooled = self.norm(tokens).mean(1)  # the class token alone, or the patches' mean
            fc_norm = frozen_layer_norm(self.fc_norm, pooled[:, None])
            return positions, lambda t: self._affine_head(fc_norm(norm(t).mean(1)))
        pool_affine = _frozen_attention_pool(self.attn_pool, self.norm(tokens))
        pooled = pool_affine(self.norm(tokens)[:, :, None])
        fc_norm = frozen_layer_norm(self.fc_norm, pooled)
        return positions, lambda t: self._affine_head(fc_norm(pool_affine(norm(t))))

    def _affine_head(self, x):
        """The head steps after pooling (checked affine: linear maps and inactive dropout)."""
        for step in self.head_steps:
            if not isinstance(step, (nn.Linear, nn.Dropout, nn.Identity)):
                raise UnsupportedBackboneError(
                    f"The image tower's head ends with a {type(step).__name__}, which is not affine; the "
                    "decomposition of its features needs linear maps after the pooling."
                )
            x = step(x)
        return x

    def stem_parameters(self):
        yield from self.patch_embed.parameters()
        for name in ("cls_token", "reg_token", "pos_embed"):
            parameter = getattr(self.trunk, name, None)
            if parameter is not None:
                yield parameter
        yield from self.trunk.norm_pre.parameters()

    def head_parameters(self):
        for module in (self.norm, self.attn_pool, self.fc_norm, *self.head_steps):
            if module is not None:
                yield from module.parameters()


def _frozen_attention_pool(pool, tokens):
    """timm's AttentionPoolLatent over ``tokens`` [B, P, D] as an affine map of per-position
    terms [B, P, X, D] -> [B, X, D']: its attention weights (from ``tokens``) and its MLP's
    output are frozen, so that only the values carry the terms (the pool is linear in its values
    once its weights are fixed)."""
    import torch.nn.functional as F

    if pool.latent_len != 1 or pool.pool != "token":
        raise UnsupportedBackboneError("The attention pool has several latent queries; the decomposition "
                                       "reads pools with one.")
    batch, length, width = tokens.shape
    heads, head_dim = pool.num_heads, pool.head_dim
    keyed = tokens if pool.pos_embed is None else tokens + pool.pos_embed.unsqueeze(0).to(tokens.dtype)
    q = pool.q_norm(pool.q(pool.latent).reshape(1, 1, heads, head_dim).transpose(1, 2))  # [1, H, 1, hd]
    k, v = pool.kv(keyed).reshape(batch, length, 2, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    k = pool.k_norm(k)
    weights = (q * pool.scale @ k.transpose(-2, -1)).softmax(-1)[:, :, 0]  # [B, H, P]
    value_weight, value_bias = pool.kv.weight[width:], None if pool.kv.bias is None else pool.kv.bias[width:]
    out = torch.einsum("bhp,bhpd->bhd", weights, v).reshape(batch, width)
    mlp = None if pool.mlp is None else pool.mlp(pool.norm(pool.proj(out)))  # [B, D']

    def apply(t):
        keyed_t = t if pool.pos_embed is None else t + pool.pos_embed[:, None].to(t.dtype)
        values = F.linear(keyed_t, value_weight, value_bias).unflatten(-1, (heads, head_dim))  # [B, P, X, H, hd]
        mixed = torch.einsum("bhp,bpxhd->bxhd", weights, values).flatten(-2)
        y = pool.proj(mixed)
        return y if mlp is None else y + mlp[:, None]

    return apply


def _is_identity(module):
    return module is None or isinstance(module, nn.Identity) or (isinstance(module, nn.Dropout) and module.p == 0)


class TimmViTVisionTower(TimmVisionTower):
    """timm ``VisionTransformer`` (SigLIP, SigLIP2: no class token, attention pool; register ViTs)."""

    ops = TimmBlockOps()

    def __init__(self, visual):
        from timm.layers import Attention
        from timm.models.vision_transformer import Block

        super().__init__(visual)
        check_block_types(self.blocks, (Block,), "image")
        check_block_types([block.attn for block in self.blocks], (Attention,), "image attention")


class EvaVisionTower(TimmVisionTower):
    """timm ``Eva`` (EVA02, PE-Core): rotary positions on the patch tokens only."""

    def embed(self, images):
        x, _ = self.trunk._pos_embed(self.patch_embed(images.to(self.patch_embed.proj.weight.dtype)))
        return x  # the rotary table is the tower's (``rotary_table``), placed where the patches are

    ops = EvaBlockOps()

    def __init__(self, visual):
        from timm.layers import AttentionRope
        from timm.models.eva import EvaAttention, EvaBlock

        super().__init__(visual)
        check_block_types(self.blocks, (EvaBlock,), "image")
        check_block_types([block.attn for block in self.blocks], (EvaAttention, AttentionRope), "image attention")
        if getattr(self.trunk, "rope_mixed", False):
            raise UnsupportedBackboneError("The Eva tower uses per-layer ('mixed') rotary positions, which the "
                                           "prompted runner does not drive.")
        self.rotate_half = bool(getattr(self.blocks[0].attn, "rotate_half", False))

    def rotary_table(self, state, length):
        rope = self.trunk.rope
        if rope is None:
            return None
        return RotaryTable(rope.get_embed(), state.patches, length, self.rotate_half)
