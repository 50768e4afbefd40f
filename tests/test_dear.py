"""DeAR on a tiny random CLIP (3 image layers of 4 heads, 2 text layers), attribute tokens at J = 2."""
import copy

import pytest
import torch
import torch.nn.functional as F

from trainers.dear import DeARCLIP, check_dear_config, deep_head_roles
from vlprompt.clip import CLIPRunner, RunState, Tokenizer, load_clip
from vlprompt.clip.head_roles import parse_role_map
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.methods.template_head import TemplateCLIP

CLASSES = ["red star", "blue circle", "striped dog"]
TEMPLATE = "a photo of a {}."
# Deep layers 2..3: heads 0..3. Layer 2: core colour, generalization, mixed, other specialised.
ROLES = {
    "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
    "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
}


@pytest.fixture(scope="module")
def tiny(tiny_clip_files, tmp_path_factory):
    config, weights = tiny_clip_files
    model, _ = load_clip(config, weights)
    path = tmp_path_factory.mktemp("roles") / "tiny_roles.yaml"
    parse_role_map(ROLES).save(str(path))
    return model, Tokenizer(config), str(path)


def dear_node(role_map, **changes):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.DEAR
    node.ROLE_MAP, node.INJECT_LAYER, node.ATTRIBUTES = role_map, 2, ["color", "shape"]
    for key, value in changes.items():
        node[key] = value
    return node


def build(tiny, dtype=torch.float32, seed=0, **changes):
    model, tokenizer, role_map = tiny
    clip = CLIPRunner(copy.deepcopy(model)).to(dtype)
    node = dear_node(role_map, **changes)
    check_dear_config(node)
    roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads)
    torch.manual_seed(seed)
    return DeARCLIP(clip, tokenizer, CLASSES, TEMPLATE, node, roles).to(dtype)


def images(batch=3, seed=1, dtype=torch.float32):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)).to(dtype)


def randomise_prompts(dear, std=2.0):
    with torch.no_grad():
        for param in dear.prompt_learner.parameters():
            param.add_(std * torch.randn_like(param))


def per_head_attention(block, x, mask=None):
    """Per-head attention weights [B, H, L, L] and outputs [B, H, L, d] of a block's attention."""
    heads = block.attn.num_heads
    q, k, v = F.linear(block.ln_1(x), block.attn.in_proj_weight, block.attn.in_proj_bias).chunk(3, -1)
    split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    weights = (scores if mask is None else scores + mask.to(scores.dtype)).softmax(-1)
    return weights, weights @ v


def test_all_generalization_class_feature_is_frozen_clip(tiny):
    """No original token can see an attribute token anywhere: f_cls is frozen CLIP's feature
    (float64: equal to rounding; float32: to 1e-5) for large random attribute tokens."""
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        dear = build(tiny, dtype=dtype, MASK_STRATEGY="all_generalization")
        randomise_prompts(dear, std=5.0)
        x = images(dtype=dtype)
        with torch.no_grad():
            f_cls, f_attr, _ = dear.encode_image(x)
            frozen = dear.clip.visual(x).features
        torch.testing.assert_close(f_cls, frozen, rtol=0, atol=tol)
        assert f_attr.shape == (3, 2, frozen.shape[1])
    # Under the role masks the class feature does change.
    dear = build(tiny)
    randomise_prompts(dear, std=5.0)
    with torch.no_grad():
        assert not torch.allclose(dear.encode_image(x.float())[0], dear.clip.visual(x.float()).features, atol=1e-3)


def layer_input(dear, x, layer):
    """Hidden states [B, N + K, D] at the input of 1-indexed image layer ``layer`` >= J."""
    visual = dear.clip.visual
    hidden = visual.run_prefix(x, dear.vision_block)
    plan = dear.vision_plan(hidden.shape[1], hidden.device)
    x = visual.run_blocks(hidden, dear.vision_block, layer - 1, plan)
    for edit in plan.edits_at(layer - 1):  # insertion (layer J) or re-mixing (later layers)
        x = edit(x, RunState())
    return x, hidden.shape[1]


@pytest.mark.parametrize("layer", [2, 3])
def test_heads_follow_their_roles(tiny, layer):
    dear = build(tiny, dtype=torch.float64)
    randomise_prompts(dear)
    with torch.no_grad():
        x, n = layer_input(dear, images(dtype=torch.float64), layer)
        block = dear.clip.visual.blocks[layer - 1]
        mask = dear.role_masks(n, x.device)[layer - 1]
        weights, outputs = per_head_attention(block, x, mask)
        _, frozen_outputs = per_head_attention(block, x[:, :n])  # the same layer input, no attribute tokens
    roles = [str(r) for r in parse_role_map(ROLES).roles[layer]]
    color, shape = slice(n, n + 1), slice(n + 1, n + 2)
    for head, role in enumerate(roles):
        if role.startswith("G") or role.startswith("O"):
            torch.testing.assert_close(outputs[:, head, :n], frozen_outputs[:, head], rtol=0, atol=1e-12)
            assert (weights[:, head, :n, n:] == 0).all() and (weights[:, head, n:, :n] == 0).all()
        elif role.startswith("A"):
            own, other = (color, shape) if role == "A color" else (shape, color)
            assert (weights[:, head, :, other] == 0).all()
            assert (weights[:, head, :, own] > 0).all()
        else:  # mixed: no mask, every query sees every token
            assert (mask[head] == 0).all() and (weights[:, head] > 0).all()


@pytest.fixture(scope="module")
def trainer_model(tiny, tiny_clip_files, tmp_path_factory):
    """The DeARCLIP that the DeAR trainer builds (base-to-novel config, the tiny CLIP, ROLES at
    J = 2) on a miniature OxfordPets, in eval mode."""
    from baseline_setup import build_seeded, toy_pets_cfg

    import datasets  # noqa: F401  (registers OxfordPets)
    from vlprompt.testing import write_oxford_pets_tree

    base = tmp_path_factory.mktemp("dear_trainer")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=2)
    cfg = toy_pets_cfg("DeAR", "DeAR/vit_b16_base2new.yaml", str(base / "data"), base / "out", tiny_clip_files,
                       "INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", "DATASET.NUM_SHOTS", "4",
                       "TRAINER.DEAR.ROLE_MAP", tiny[2], "TRAINER.DEAR.INJECT_LAYER", "2",
                       "TRAINER.DEAR.ATTRIBUTES", "['color', 'shape']")
    return build_seeded(cfg).model.eval()


def per_head_outputs_of_block(model, block_index, run):
    """Each call's attention output of image block ``block_index`` before its output
    projection, split by head: a list of [B, L, heads, D / heads], captured by a forward
    pre-hook on the block's ``attn.out_proj`` (whatever code calls the block)."""
    block = model.clip.visual.blocks[block_index]
    heads, calls = block.attn.num_heads, []

    def record(module, inputs):
        calls.append(inputs[0].detach().unflatten(-1, (heads, -1)).clone())

    handle = block.attn.out_proj.register_forward_pre_hook(record)
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return calls


def injection_layer_heads(model, x):
    """Per-head attention outputs [B, N + K, heads, d] of layer J in DeAR's forward."""
    (outputs,) = per_head_outputs_of_block(model, model.vision_block, lambda: model(x))
    return outputs


def test_core_heads_see_only_their_attribute_in_deears_forward(trainer_model):
    """Layer J (= 2) of ROLES: head 0 is colour's core head, 1 and 3 are isolated (G, O text),
    2 is mixed. Through the trainer's model: perturbing the shape token leaves the colour
    head's outputs at [CLS] and the patches bit-identical, perturbing the colour token changes
    them; the isolated heads' outputs there are frozen CLIP's given the same images (layers
    below J are frozen CLIP, so their layer-J input is the same).

    "Frozen CLIP's" is bit for bit under PyTorch's math attention kernel. The default fused
    CPU kernel reduces over 19 keys (17 original + 2 attribute tokens) in another order than
    over frozen CLIP's 17, which moves these outputs (|values| < 1) by up to 2.4e-7 (a few
    float32 ulps; measured on the tiny CLIP): there they must agree to 1e-6, far below the
    1e-3 that an attribute token seen by the head moves them.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = trainer_model
    attributes = list(model.attributes)
    color, shape = attributes.index("color"), attributes.index("shape")
    core, isolated, mixed = 0, (1, 3), 2
    x = images()

    def with_token(index, fn):
        """fn() with attribute ``index``'s token P0 moved by N(0, 3^2) noise."""
        tokens = model.prompt_learner.attr_tokens
        saved = tokens.detach().clone()
        with torch.no_grad():
            tokens[index] += 3.0 * torch.randn(tokens[index].shape, generator=torch.Generator().manual_seed(index))
        try:
            return fn()
        finally:
            with torch.no_grad():
                tokens.copy_(saved)

    def runs():
        """Layer-J per-head outputs of frozen CLIP [B, N, H, d] and of DeAR as it is, with the
        shape token and with the colour token perturbed [B, N + 2, H, d]."""
        (frozen,) = per_head_outputs_of_block(model, model.vision_block, lambda: model.clip.visual(x))
        base = injection_layer_heads(model, x)
        other = with_token(shape, lambda: injection_layer_heads(model, x))
        own = with_token(color, lambda: injection_layer_heads(model, x))
        return frozen, base, other, own

    frozen, base, other, own = runs()
    n = frozen.shape[1]  # [CLS] + 16 patches
    assert frozen.shape == (3, 17, 4, 16) and base.shape == (3, n + 2, 4, 16)
    assert torch.equal(other[:, :n, core], base[:, :n, core])
    assert (own[:, :n, core] - base[:, :n, core]).abs().amax() > 1e-3
    assert (other[:, :n, mixed] - base[:, :n, mixed]).abs().amax() > 1e-3  # the perturbation reaches layer J
    assert (base[:, :n, core] - frozen[:, :, core]).abs().amax() > 1e-3
    for head in isolated:
        for run in (base, other, own):
            torch.testing.assert_close(run[:, :n, head], frozen[:, :, head], rtol=0, atol=1e-6)
    with sdpa_kernel(SDPBackend.MATH):
        frozen, base, other, own = runs()
    assert torch.equal(other[:, :n, core], base[:, :n, core])
    for head in isolated:
        for run in (base, other, own):
            assert torch.equal(run[:, :n, head], frozen[:, :, head]), head

    # Control: a mask that lets the colour head see the shape token is caught.
    mask = model.role_masks(n, x.device)[model.vision_block]
    saved = mask.clone()
    mask[core, :, n + shape] = 0.0
    try:
        leaky_base = injection_layer_heads(model, x)
        leaky_other = with_token(shape, lambda: injection_layer_heads(model, x))
    finally:
        mask.copy_(saved)
    assert (leaky_other[:, :n, core] - leaky_base[:, :n, core]).abs().amax() > 1e-3


def test_masks_are_built_once_per_length_and_shared_by_the_batch(tiny):
    dear = build(tiny)
    first = dear.vision_plan(17, torch.device("cpu")).masks
    again = dear.vision_plan(17, torch.device("cpu")).masks
    assert sorted(first) == [1, 2] and all(first[b] is again[b] for b in first)
    assert first[1].shape == (4, 19, 19)  # [heads, L, L]: no batch dimension
    assert build(tiny, MASK_STRATEGY="all_mixed").vision_plan(17, torch.device("cpu")).masks == {}
    two_tokens = build(tiny, N_ATTR_TOKENS=2)
    assert two_tokens.vision_plan(17, torch.device("cpu")).masks[1].shape == (4, 21, 21)
    assert two_tokens.encode_image(images())[1].shape == (3, 2, 32)
    shuffled = build(tiny, MASK_STRATEGY="random_shuffle", SHUFFLE_SEED=1).vision_plan(17, torch.device("cpu")).masks
    assert any(not torch.equal(shuffled[b], first[b]) for b in first)


def test_beta_remixing_of_attribute_and_text_rows(tiny):
    dear = build(tiny, BETA=0.7)
    raw_v = dear.prompt_learner.attr_tokens.flatten(0, 1)
    x = torch.randn(2, 19, 64)
    (remix,) = dear.vision_plan(17, x.device).edits_at(2)
    out = remix(x, None)
    torch.testing.assert_close(out[:, :17], x[:, :17], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 17:], 0.7 * x[:, 17:] + 0.3 * raw_v)
    text_plan = dear.text_plan()
    assert list(text_plan.layers) == [1]  # 2 text layers, J = 2: insertion only, nothing after
    dear3 = build(tiny, TEXT_INJECT_LAYER=1, BETA=0.7)
    (remix_t,) = dear3.text_plan().edits_at(1)
    t = torch.randn(3, 32, 32)
    out = remix_t(t, None)
    raw_t = dear3.prompt_learner.text_tokens
    torch.testing.assert_close(out[:, 1:5], 0.7 * t[:, 1:5] + 0.3 * raw_t)
    torch.testing.assert_close(out[:, [0, *range(5, 32)]], t[:, [0, *range(5, 32)]], rtol=0, atol=0)


def test_cached_text_prefix_equals_recomputing_all_layers_at_full_length(tiny):
    """DeAR's text features (cached prefix below J) equal running every layer from the
    embeddings of the full-length sentences with the same prompts."""
    dear = build(tiny, TEXT_INJECT_LAYER=2)
    randomise_prompts(dear)
    text = dear.clip.text
    text.clear_cache()
    full_ids = dear.tokenizer([TEMPLATE.format(name) for name in CLASSES], reserve=4)
    assert torch.equal(dear.token_ids, full_ids) and full_ids.shape[1] == 32
    with torch.no_grad():
        cached = dear.compute_text_features()
        assert len(text._prefix_cache) == 1
        cached_again = dear.compute_text_features()
        assert len(text._prefix_cache) == 1
        full = text(embeddings=text.embed(full_ids), eot=full_ids.argmax(-1), plan=dear.text_plan())
    torch.testing.assert_close(cached, full.features, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cached_again, cached, rtol=0, atol=0)
    # The prompts were inserted: the pooled position moved by N_CTX_TEXT.
    assert torch.equal(full.eot, full_ids.argmax(-1) + 4)


def test_no_prompt_tokens_and_no_attribute_tokens_is_zero_shot_clip(tiny):
    model, tokenizer, _ = tiny
    dear = build(tiny, N_CTX_TEXT=0, N_ATTR_TOKENS=0).eval()
    zero_shot = TemplateCLIP(CLIPRunner(copy.deepcopy(model)), tokenizer, CLASSES, [TEMPLATE]).eval()
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(dear(x), zero_shot(x), rtol=1e-5, atol=1e-5)
        dear.inference = "cls"
        torch.testing.assert_close(dear(x), zero_shot(x), rtol=1e-5, atol=1e-5)


def test_fusion_logits_and_loss_terms(tiny):
    dear = build(tiny)
    randomise_prompts(dear)
    x, labels = images(), torch.tensor([0, 2, 1])
    f_cls, f_attr, _ = dear.encode_image(x)
    text = F.normalize(dear.compute_text_features(), dim=-1)
    w = dear.prompt_learner.fusion_logits.softmax(0)
    expected = sum(w[k] * dear.logit_scale * F.normalize(f, dim=-1) @ text.t()
                   for k, f in enumerate([f_cls] + list(f_attr.unbind(1))))
    torch.testing.assert_close(dear.fused_logits(f_cls, f_attr, text), expected, rtol=1e-5, atol=1e-4)
    total, logits, terms = dear.loss(x, labels)
    torch.testing.assert_close(terms["ce"], F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(terms["fusion"], 1 - w[0])
    assert terms["reg"] > 0
    torch.testing.assert_close(total, terms["ce"] + 1.0 * terms["reg"] + 0.7 * terms["fusion"])
    dear.fusion_loss = "neg_log"
    torch.testing.assert_close(dear.loss(x, labels)[2]["fusion"], -torch.log(w[0]))
    # Each term off with its weight.
    plain = build(tiny, LAMBDA_REG=0.0, LAMBDA_FUSION=0.0)
    assert set(plain.loss(x, labels)[2]) == {"ce"}


def test_regulariser_compares_with_plain_frozen_clip(tiny):
    """L_reg's frozen branch (continued from the shared layer-J prefix and its projections)
    gives plain frozen CLIP's features: the term equals the one computed from scratch."""
    dear = build(tiny)
    randomise_prompts(dear)
    x, labels = images(), torch.tensor([0, 2, 1])
    f_cls = dear.encode_image(x)[0]
    text = dear.compute_text_features()
    with torch.no_grad():
        frozen_image = dear.clip.encode_image_plain(x)
        frozen_text = dear.clip.text(dear.token_ids).features
    expected = (1 - F.cosine_similarity(f_cls, frozen_image, dim=-1)).mean() + (
        1 - F.cosine_similarity(text, frozen_text, dim=-1)).mean()
    assert expected > 1e-3
    torch.testing.assert_close(dear.loss(x, labels)[2]["reg"], expected.detach(), rtol=1e-5, atol=1e-6)


def test_one_step_changes_only_deears_tensors(tiny):
    dear = build(tiny)
    learnable = dict(dear.prompt_learner.named_parameters())
    assert set(learnable) == {"attr_tokens", "text_tokens", "attr_proj", "fusion_logits"}
    assert [p for p in dear.parameters() if p.requires_grad] == list(learnable.values())
    frozen_before = {name: p.clone() for name, p in dear.clip.named_parameters()}
    learnable_before = {name: p.clone() for name, p in learnable.items()}
    optimizer = torch.optim.AdamW(learnable.values(), lr=1e-3)
    loss, _, _ = dear.loss(images(), torch.tensor([0, 1, 2]))
    loss.backward()
    optimizer.step()
    for name, p in dear.clip.named_parameters():
        assert torch.equal(p, frozen_before[name]), name
    for name, p in learnable.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert not torch.equal(p, learnable_before[name]), name


def test_eval_is_deterministic_and_inference_modes_differ(tiny):
    dear = build(tiny).eval()
    randomise_prompts(dear)
    x = images()
    with torch.no_grad():
        first, second = dear(x), dear(x)
        dear.inference = "cls"
        decoupled = dear(x)
        f_cls = dear.encode_image(x)[0]
    assert torch.equal(first, second)
    expected = dear.logit_scale * F.normalize(f_cls, dim=-1) @ dear.class_text_features().t()
    torch.testing.assert_close(decoupled, expected)
    assert not torch.allclose(first, decoupled)


@pytest.mark.parametrize("inference, role, uses", [
    ("auto", "base", "fusion"), ("auto", "new", "fusion"), ("auto", "source", "fusion"), ("auto", "target", "cls"),
    ("fusion", "target", "fusion"), ("cls", "base", "cls"),
])
def test_inference_follows_the_evaluation_role_unless_set(tiny, inference, role, uses):
    """INFERENCE auto: fusion on the training dataset's classes, f_cls only on a target dataset."""
    model, tokenizer, role_map = tiny
    node = dear_node(role_map, INFERENCE=inference)
    clip = CLIPRunner(copy.deepcopy(model))
    roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads)
    torch.manual_seed(0)
    dear = DeARCLIP(clip, tokenizer, CLASSES, TEMPLATE, node, roles, eval_scope=role).eval()
    randomise_prompts(dear)
    x = images()
    with torch.no_grad():
        f_cls, f_attr, _ = dear.encode_image(x)
        text = dear.class_text_features()
        expected = {"cls": dear.logit_scale * F.normalize(f_cls, dim=-1) @ text.t(),
                    "fusion": dear.fused_logits(f_cls, f_attr, text)}
        logits = dear(x)
    assert dear.inference == uses
    torch.testing.assert_close(logits, expected[uses])
    assert not torch.allclose(expected["cls"], expected["fusion"], atol=1e-3)


def test_new_class_list_rebuilds_the_sentences(tiny):
    dear = build(tiny).eval()
    with torch.no_grad():
        assert dear(images()).shape == (3, 3)
        dear.set_classnames(["green ring", "dotted square"])
        assert dear(images()).shape == (3, 2)
        assert dear.frozen_text_features().shape[0] == 2


@pytest.mark.parametrize("changes, message", [
    ({"MASK_STRATEGY": "all_heads"}, r"TRAINER.DEAR.MASK_STRATEGY must be one of \['role'"),
    ({"FUSION_LOSS": "log"}, r"TRAINER.DEAR.FUSION_LOSS must be one of"),
    ({"INFERENCE": "attr"}, r"TRAINER.DEAR.INFERENCE must be one of"),
    ({"BETA": 1.5}, r"TRAINER.DEAR.BETA must be between 0.0 and 1.0"),
    ({"LAMBDA_REG": -1.0}, r"TRAINER.DEAR.LAMBDA_REG must be at least 0"),
    ({"ATTRIBUTES": ["color", "color"]}, r"ATTRIBUTES must be distinct"),
    ({"INJECT_LAYER": 1}, r"injection layer is 1, but .* only for layers 2..3"),
    ({"ATTRIBUTES": ["color", "texture"]}, r'Attribute "texture"'),
    ({"ROLE_MAP": "missing.yaml"}, r'Role map "missing.yaml" does not exist'),
])
def test_invalid_config_raises_config_error(tiny, changes, message):
    with pytest.raises(ConfigError, match=message):
        check_dear_config(dear_node(tiny[2], **changes))


def test_role_map_of_another_backbone_is_rejected(tiny):
    node = dear_node("configs/head_roles/vit_b16_openai.yaml", INJECT_LAYER=9)
    check_dear_config(node)  # the file itself is fine
    with pytest.raises(ConfigError, match="12 layers of 12 heads .* loaded backbone has 3 layers of 4 heads"):
        deep_head_roles(node, 3, 4)


@pytest.mark.slow
def test_vit_b16_with_the_papers_role_map():
    """The shipped map fits ViT-B/16; sizes of the learnable tensors; one loss evaluation."""
    model, _ = load_clip("ViT-B/16", "random")
    clip = CLIPRunner(model)
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.DEAR
    cfg.MODEL.BACKBONE.NAME = "ViT-B/16"  # ROLE_MAP auto: the paper's map of ViT-B/16 OpenAI
    check_dear_config(node, cfg.MODEL.BACKBONE)
    roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads, cfg.MODEL.BACKBONE)
    assert sorted(roles) == [9, 10, 11, 12]
    dear = DeARCLIP(clip, Tokenizer("ViT-B/16"), ["cat", "dog"], "a photo of a {}, a type of pet.", node, roles)
    sizes = {name: p.numel() for name, p in dear.prompt_learner.named_parameters()}
    assert sizes == {"attr_tokens": 5 * 768, "text_tokens": 4 * 512, "attr_proj": 768 * 512, "fusion_logits": 6}
    masks = dear.role_masks(197, torch.device("cpu"))
    assert sorted(masks) == [8, 9, 10, 11] and masks[8].shape == (12, 202, 202)
    total, logits, terms = dear.loss(torch.randn(1, 3, 224, 224), torch.tensor([1]))
    assert logits.shape == (1, 2) and set(terms) == {"ce", "reg", "fusion"} and torch.isfinite(total)
