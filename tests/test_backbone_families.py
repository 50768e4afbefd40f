"""The runner on every model family open_clip builds, against open_clip's own forward.

One small random model per family (``vlprompt.testing.FAMILY_TEST_CONFIGS``): OpenAI-layout
CLIP (open_clip ``VisionTransformer``), SigLIP (timm ``VisionTransformer``, attention pool, no
class token; bidirectional text pooled at its last position; logit bias), EVA02 and PE-Core
(timm ``Eva``: rotary positions, SwiGLU, layer scale, attention pool for PE-Core) and a
register-token ViT. With an empty plan the runner must equal open_clip's ``encode_image``,
``encode_text`` and logits to fp32 rounding; the edits must mean the same on every family.
"""
import copy

import open_clip
import pytest
import torch
import torch.nn.functional as F
from fast_cases import representative

from vlprompt.clip import CLIPRunner, InsertTokens, Plan, ReplaceTokens, Tokenizer, load_clip
from vlprompt.testing import FAMILY_TEST_CONFIGS, write_family_clip

FAMILIES = tuple(FAMILY_TEST_CONFIGS)
TOL = dict(rtol=1e-5, atol=1e-5)
EXPECTED_LAYOUT = {  # family: (tower adapter, prefix tokens, pooling, rotary, image blocks)
    "openai": ("OpenCLIPVisionTower", 1, "token", False, 3),
    "siglip": ("TimmViTVisionTower", 0, "map", False, 6),
    "eva02": ("EvaVisionTower", 1, "token", True, 6),
    "pe_core": ("EvaVisionTower", 1, "map", True, 6),
    "vit_reg": ("TimmViTVisionTower", 3, "token", False, 6),
}


@pytest.fixture(scope="module", params=representative(FAMILIES, {"openai", "siglip", "eva02"}))
def family(request, tmp_path_factory):
    """(family, open_clip model, CLIPRunner, Tokenizer, images [3, 3, 32, 32], token ids [3, L])."""
    config, weights = write_family_clip(str(tmp_path_factory.mktemp(request.param)), request.param)
    model, _ = load_clip(config, weights)
    tokenizer = Tokenizer(config)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    ids = tokenizer(["a photo of a dog.", "a red star", "itap of a very small striped hexagon."])
    return request.param, model, CLIPRunner(model), tokenizer, images, ids


def test_every_family_gets_its_adapter_and_layout(family):
    name, _, runner, _, _, _ = family
    layout, visual = runner.visual.layout, runner.visual
    assert (type(visual).__name__, layout.prefix_tokens, layout.pooling, layout.rotary, visual.num_layers) == \
        EXPECTED_LAYOUT[name]
    assert layout.num_patches == 16 and visual.num_heads == 4
    assert (runner.logit_bias is not None) == (name == "siglip")
    assert runner.text.causal == (name != "siglip")


def _encode(model, runner, images, ids):
    """open_clip's (image features, text features, logits) and the runner's."""
    with torch.no_grad():
        image, text = runner.encode_image(images), runner.encode_text(ids)
        logits = runner.logits(F.normalize(image, dim=-1), F.normalize(text, dim=-1))
        theirs = (model.encode_image(images), model.encode_text(ids), model.get_logits(images, ids)[0])
    return theirs, (image, text, logits)


def test_empty_plan_equals_open_clip(family):
    """The same computation: in float64 the runner's image features, text features and logits
    (scale * cos, plus the bias of a sigmoid model) equal open_clip's to 1e-12. In fp32 the
    image features agree to 1e-6; text features and logits go through other attention
    kernels than open_clip's ``nn.MultiheadAttention`` and differ by fp32 rounding, so there
    the runner must be about as close to the float64 result as open_clip's own fp32 forward is:
    within twice its error, or 8 units in the last place of the output's scale (the largest feature
    value; for logits, scale * cos, the temperature)."""
    _, model, runner, _, images, ids = family
    model64 = copy.deepcopy(model).double()
    exact64 = _encode(model64, CLIPRunner(model64), images.double(), ids)
    for theirs, ours in zip(*exact64):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    truth = exact64[0]
    (image32, text32, logits32), ours32 = _encode(model, runner, images, ids)
    torch.testing.assert_close(ours32[0], image32, rtol=0, atol=1e-6)
    torch.testing.assert_close(runner.visual(images).features, image32, rtol=0, atol=1e-6)
    for name, theirs, ours, reference in zip(("image", "text", "logits"), (image32, text32, logits32), ours32, truth):
        their_error = (theirs.double() - reference).abs().max().item()
        our_error = (ours.double() - reference).abs().max().item()
        unit = runner.logit_scale.exp().item() if name == "logits" else reference.abs().max().item()
        last_place = torch.finfo(torch.float32).eps * unit
        assert our_error <= max(8 * last_place, 2 * their_error), (name, our_error, their_error, last_place)


def test_rows_of_the_last_block_are_exact_for_them(family):
    """Asking for some final tokens equals reading them from the full computation."""
    _, _, runner, _, images, _ = family
    visual = runner.visual
    extra = torch.randn(2, visual.width)
    plan = Plan(layers={1: InsertTokens(extra)})
    with torch.no_grad():
        full = visual(images, plan)
        some = visual(images, plan, rows=[visual.layout.length + 1, 2])
    torch.testing.assert_close(some.tokens, full.tokens[:, [visual.layout.length + 1, 2]], **TOL)
    torch.testing.assert_close(some.features, full.features, **TOL)


def test_tokens_nobody_attends_to_change_nothing_wherever_they_sit(family):
    """Prompt tokens appended after the patches, or inserted right after the prefix tokens
    (moving the patches, and with them their rotary positions), leave the original tokens'
    outputs unchanged when no original token attends to them; the pool reads the original
    tokens only (``pool_keys``)."""
    _, _, runner, _, images, _ = family
    visual = runner.visual
    n, length = 3, visual.layout.length
    prefix = visual.layout.prefix_tokens
    extra = torch.randn(n, visual.width)
    with torch.no_grad():
        plain = visual(images)
        for at, original in ((None, list(range(length))),
                             (prefix, list(range(prefix)) + list(range(prefix + n, length + n)))):
            mask = torch.zeros(length + n, length + n)
            mask[original, (length if at is None else prefix):(length + n if at is None else prefix + n)] = float("-inf")
            plan = Plan(layers={0: InsertTokens(extra, at=at)}, masks=dict.fromkeys(range(visual.num_layers), mask))
            out = visual(images, plan, pool_keys=original)
            torch.testing.assert_close(out.tokens[:, original], plain.tokens, **TOL)
            torch.testing.assert_close(out.features, plain.features, **TOL)


def test_replaced_prompt_tokens_reach_the_features(family):
    """A deep prompt replacing the last tokens changes the pooled feature through attention
    (the pool, or the class token, attends to them) and gets gradients."""
    _, _, runner, _, images, _ = family
    visual = runner.visual
    first = torch.randn(2, visual.width)
    deep = torch.randn(2, visual.width, requires_grad=True)
    plan = Plan(embed=[InsertTokens(first)], layers={1: ReplaceTokens(deep, at=-2)})
    features = visual(images, plan).features
    assert not torch.allclose(features, visual(images).features)
    features.sum().backward()
    assert deep.grad is not None and deep.grad.abs().sum() > 0


def test_token_features_take_a_token_through_the_head(family):
    """On class-token towers the pooled feature is the class token's; ``projection`` replaces
    the head's final linear map (a copy gives the same features)."""
    name, _, runner, _, images, _ = family
    visual = runner.visual
    with torch.no_grad():
        out = visual(images)
        tokens = out.tokens[:, :2]
        direct = visual.token_features(tokens)
        assert direct.shape == (3, 2, visual.output_dim)
        if visual.layout.pooling == "token":
            torch.testing.assert_close(direct[:, 0], out.features, **TOL)
        projection = visual.projection
        if projection is None:
            assert name == "siglip"  # attention pool, no projection after it
            projection = torch.eye(visual.output_dim)
        torch.testing.assert_close(visual.token_features(tokens, projection.clone()), direct, **TOL)


def test_text_context_sits_after_the_start_tokens_and_the_pooled_position_follows(family):
    """Tokens inserted after the start token (kept to the context length) and the pooled
    position: causal towers pool the moved end-of-text token, bidirectional ones the last
    position; a context opening the sentence (no start token) is the same edit at 0."""
    name, _, runner, tokenizer, _, ids = family
    text = runner.text
    n = 4
    context = torch.randn(n, text.width, requires_grad=True)
    plan = Plan(embed=[InsertTokens(context, at=tokenizer.start_tokens, keep_length=True)])
    out = text(ids, plan, all_tokens=True)
    expected = text.eot_positions(ids) + (0 if name == "siglip" else n)
    assert out.eot.tolist() == expected.tolist()
    assert tokenizer.start_tokens == 1
    out.features.sum().backward()
    assert context.grad.abs().sum() > 0
    opening = text(ids, Plan(embed=[InsertTokens(context.detach(), at=0, keep_length=True)]))
    assert not torch.allclose(opening.features, out.features.detach())


def test_padding_reaches_a_bidirectional_tower_only(family):
    """SigLIP's text tower has no causal mask and pools its last position: the padding is part
    of every sentence's feature, so nothing may be cut. A causal tower never sees it."""
    name, _, runner, _, _, ids = family
    text = runner.text
    padding = torch.randn(1, text.width)
    with torch.no_grad():
        changed = text(ids, Plan(layers={0: ReplaceTokens(padding, at=-1)})).features
        plain = text(ids).features
    assert torch.allclose(changed, plain) == (name != "siglip")


def test_towers_no_adapter_drives_keep_plain_image_features(tmp_path):
    """A ResNet image tower: no prompted adapter, a reason, and plain features."""
    from vlprompt.testing import TINY_RESNET_CLIP_CONFIG, write_tiny_clip

    config, weights = write_tiny_clip(str(tmp_path), name="tiny-resnet-family", config=TINY_RESNET_CLIP_CONFIG)
    model, _ = load_clip(config, weights)
    runner = CLIPRunner(model)
    assert runner.visual is None and "ViT image tower" in runner.visual_error
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(runner.encode_image_plain(images), model.encode_image(images), rtol=0, atol=0)


@pytest.mark.parametrize("name, adapter, layout", [
    ("ViT-B-16", "OpenCLIPVisionTower", (1, 196, "token", False)),
    *(pytest.param(*case, marks=pytest.mark.slow) for case in (  # real-size towers: the fast loop builds one
        ("ViT-B-16-SigLIP2", "TimmViTVisionTower", (0, 196, "map", False)),
        ("EVA02-B-16", "EvaVisionTower", (1, 196, "token", True)),
        ("PE-Core-T-16-384", "EvaVisionTower", (1, 576, "map", True)),
    )),
])
def test_the_real_family_configs_get_their_adapters(name, adapter, layout):
    """open_clip's own configs of each family (built on the meta device: shapes, no weights)."""
    from open_clip.factory import get_model_config
    from open_clip.model import CLIP, CustomTextCLIP

    config = dict(get_model_config(name))
    model_class = CustomTextCLIP if config.pop("custom_text", False) else CLIP
    with torch.device("meta"):
        visual = CLIPRunner(model_class(**config)).visual
    assert type(visual).__name__ == adapter
    assert (visual.layout.prefix_tokens, visual.layout.num_patches, visual.layout.pooling, visual.layout.rotary) == layout


def test_head_decomposition_adds_up_to_the_features(family):
    """Per-head direct contributions (through the frozen readout: class token or attention
    pool) plus the other terms give the features exactly, for every family; every head of
    the analysed blocks contributes."""
    from vlprompt.interpret import decompose_image_features

    _, _, runner, _, images, _ = family
    visual = runner.visual
    for num_layers in (1, visual.num_layers):
        parts = decompose_image_features(visual, images, num_layers)
        assert parts.heads.shape == (3, num_layers, visual.num_heads, visual.output_dim)
        with torch.no_grad():
            torch.testing.assert_close(parts.total(), visual(images).features, **TOL)
        assert (parts.heads.flatten(2).norm(dim=-1) > 0).all()


def _attention_branch(model, x):
    """Block 1's attention branch (before the residual add) computed by the model's own modules."""
    visual = model.visual
    if hasattr(visual, "transformer"):  # open_clip ViT
        block = visual.transformer.resblocks[1]
        return block.ls_1(block.attention(block.ln_1(x)))
    block, trunk = visual.trunk.blocks[1], visual.trunk
    if hasattr(block, "gamma_1"):  # timm Eva: rotary positions after the prefix tokens
        out = block.attn(block.norm1(x), rope=trunk.rope.get_embed() if trunk.rope is not None else None)
        return out if block.gamma_1 is None else block.gamma_1 * out
    return block.ls1(block.attn(block.norm1(x)))


def test_block_head_terms_split_the_attention_output_by_head(family):
    """A block's head terms plus its bias term equal the attention branch's output (EVA02's
    norm after the heads included), and head h's term is what zeroing head h's slice of the
    output projection removes (families without a norm after the heads)."""
    from vlprompt.interpret import block_head_terms

    _, model, runner, _, images, _ = family
    visual = runner.visual
    positions = [0, 5, 9]
    norm, _, proj = visual.ops.attention_parts(visual.blocks[1])
    with torch.no_grad():
        x = visual.run_prefix(images, 1)
        heads, bias = block_head_terms(visual, 1, x, positions)
        attention = _attention_branch(model, x)[:, positions]
        torch.testing.assert_close(heads.sum(2) + bias, attention, **TOL)
        if norm is not None:
            return
        width = proj.weight.shape[1] // visual.num_heads
        for head in range(visual.num_heads):
            saved = proj.weight[:, head * width:(head + 1) * width].clone()
            proj.weight[:, head * width:(head + 1) * width] = 0
            ablated = _attention_branch(model, x)[:, positions]
            proj.weight[:, head * width:(head + 1) * width] = saved
            torch.testing.assert_close(attention - ablated, heads[:, :, head], **TOL)


def test_the_runner_registers_every_weight_once(family):
    """Each frozen weight has one name in the runner (checkpoints of fine-tuned towers hold it
    once), and the runner holds the model's every parameter."""
    _, model, runner, _, _, _ = family
    names = [name for name, _ in runner.named_parameters(remove_duplicate=False)]
    assert len(names) == len({id(p) for p in runner.parameters()})
    assert {id(p) for p in runner.parameters()} == {id(p) for p in model.parameters()}
