"""Small timm image towers of each family, registered with timm under ``vlprompt_*`` names.

open_clip builds a timm image tower by name (``vision_cfg.timm_model_name``) and passes only
the head's options (``num_classes``, ``global_pool``), so a reduced-size tower of a family
needs a registered timm name. These architectures keep everything that makes their family
what it is and shrink only width, depth and input size (32x32 images, patch 8, 16 patches):

* ``vlprompt_tiny_siglip``: timm ``VisionTransformer`` without a class token, pooled by an
  attention-pool (``map``) head, as SigLIP's and SigLIP2's image towers.
* ``vlprompt_tiny_eva02``: timm ``Eva`` as EVA02-CLIP's: rotary positions on the patch tokens,
  separate q/k/v projections (no k bias), SwiGLU MLP with its inner norm, a norm inside
  attention, class-token pooling.
* ``vlprompt_tiny_pe_core``: timm ``Eva`` as PE-Core's: ``AttentionRope`` with a fused qkv,
  a norm before the blocks, rotary positions on an ``xy`` grid offset by one, layer scale,
  attention-pool head.
* ``vlprompt_tiny_vit_reg``: timm ``VisionTransformer`` with a class token and two register
  tokens, pooled by the class token (the layout of register-token ViTs).

* ``vlprompt_synthetic_eva02``: the image tower of the project's second synthetic backbone
  (``configs/clip/tiny-synthetic-eva02.json``): ``vlprompt_tiny_eva02``'s architecture at the
  tiny CLIP's size (6 blocks of 16 heads of width 8).

They are built with random weights offline; tests pair them with small text towers
(``vlprompt.testing.FAMILY_TEST_CONFIGS``). ``register_small_towers`` registers them; ``vlprompt.clip.loading`` calls it
before it builds a model.
"""
from functools import partial

__all__ = ["SMALL_TOWERS", "register_small_towers"]

SMALL_TOWERS = ("vlprompt_tiny_siglip", "vlprompt_tiny_eva02", "vlprompt_tiny_pe_core", "vlprompt_tiny_vit_reg",
                "vlprompt_synthetic_eva02")

_COMMON = dict(img_size=32, patch_size=8)
# Options timm's create_model passes to every entry point that concern pretrained weights, which
# these towers never have.
_LOADING_OPTIONS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _build(cls, defaults, kwargs):
    """``cls`` built from the family's defaults overridden by create_model's options, with the
    pretrained-config record timm's builder would attach (open_clip reads ``default_cfg``)."""
    options = {key: value for key, value in kwargs.items() if key not in _LOADING_OPTIONS}
    model = cls(**{**_COMMON, **defaults, **options})
    model.pretrained_cfg = model.default_cfg = {"input_size": (3, 32, 32), "pool_size": None}
    return model


def _definitions():
    """{timm name: entry point} of the small towers (imports timm)."""
    import torch
    from timm.layers import LayerNorm
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    def vlprompt_tiny_siglip(**kwargs):
        """SigLIP-style tower: no class token, attention-pool head (width 32, 6 blocks of 4 heads)."""
        defaults = dict(embed_dim=32, depth=6, num_heads=4, class_token=False, global_pool="map",
                        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
        return _build(VisionTransformer, defaults, kwargs)

    eva02 = dict(depth=6, qkv_fused=False, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True,
                 scale_attn_inner=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4), global_pool="token")

    def vlprompt_tiny_eva02(**kwargs):
        """EVA02-CLIP-style tower: RoPE, SwiGLU with inner norm, attention inner norm, class token."""
        return _build(Eva, dict(eva02, embed_dim=32, num_heads=4), kwargs)

    def vlprompt_synthetic_eva02(**kwargs):
        """The second synthetic backbone's tower: the EVA02-style tower at width 128, 16 heads of width 8."""
        return _build(Eva, dict(eva02, embed_dim=128, num_heads=16), kwargs)

    def vlprompt_tiny_pe_core(**kwargs):
        """PE-Core-style tower: AttentionRope, pre-block norm, xy RoPE grid, layer scale, attention pool."""
        defaults = dict(embed_dim=32, depth=6, num_heads=4, global_pool="map", attn_type="rope",
                        use_pre_transformer_norm=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4),
                        rope_grid_offset=1.0, rope_grid_indexing="xy", attn_pool_num_heads=4,
                        attn_pool_mlp_ratio=4.0, init_values=0.1, norm_layer=partial(LayerNorm, eps=1e-5))
        return _build(Eva, defaults, kwargs)

    def vlprompt_tiny_vit_reg(**kwargs):
        """Register-token ViT: a class token and two registers, class-token pooling."""
        defaults = dict(embed_dim=32, depth=6, num_heads=4, class_token=True, reg_tokens=2, global_pool="token")
        return _build(VisionTransformer, defaults, kwargs)

    return {fn.__name__: fn for fn in (vlprompt_tiny_siglip, vlprompt_tiny_eva02, vlprompt_tiny_pe_core,
                                       vlprompt_tiny_vit_reg, vlprompt_synthetic_eva02)}


def register_small_towers():
    """Register the small towers with timm (once; called before open_clip builds a model)."""
    from timm.models import is_model, register_model

    for name, entry_point in _definitions().items():
        if not is_model(name):
            entry_point.__module__ = __name__
            register_model(entry_point)
