"""Deep prompts (vlprompt.clip.deep_prompts) against step-by-step implementations of
deep text and vision prompts written with open_clip's own modules, plus the config checks
and reading checkpoints in the reference layout."""
import pytest
import torch
from torch import nn
from yacs.config import CfgNode

from vlprompt.clip import (
    CLIPRunner, PromptedCLIP, TextContext, Tokenizer, check_context_init, check_prompt_depth, check_prompt_sizes,
    load_clip, prompt_parameters, read_reference_checkpoints, text_prompt_plan, tower_depths, vision_prompt_plan,
)
from vlprompt.config import ConfigError, check_choice, check_range, get_cfg_default

TOL = dict(rtol=1e-5, atol=1e-5)
CLASSNAMES = ["golden_retriever", "red star", "cat"]


@pytest.fixture(scope="module")
def tiny(tiny_clip_files):
    config, weights = tiny_clip_files
    model, _ = load_clip(config, weights)
    return model, CLIPRunner(model), Tokenizer(config)


def spec_image_features(visual, images, prompts):
    """Deep vision prompts literally: V_1 appended after the positional embedding and before ln_pre, V_k
    overwriting the last n tokens at the input of layer k, class token pooled."""
    batch, n = images.shape[0], prompts[0].shape[0]
    x = visual.conv1(images).flatten(2).transpose(1, 2)
    x = torch.cat([visual.class_embedding.expand(batch, 1, -1), x], dim=1) + visual.positional_embedding
    x = visual.ln_pre(torch.cat([x, prompts[0].expand(batch, -1, -1)], dim=1))
    for k, block in enumerate(visual.transformer.resblocks, start=1):
        if 2 <= k <= len(prompts):
            x = torch.cat([x[:, :-n], prompts[k - 1].expand(batch, -1, -1)], dim=1)
        x = block(x)
    return visual.ln_post(x[:, 0]) @ visual.proj


def spec_text_features(model, token_ids, ctx, deep):
    """Deep text prompts literally: context at positions 1..n before the positional embedding, deep
    prompts overwriting positions 1..n at the input of layers 2..J, EOT pooled."""
    rows, n = token_ids.shape[0], ctx.shape[0]
    x = model.token_embedding(token_ids)
    x = torch.cat([x[:, :1], ctx.expand(rows, -1, -1), x[:, 1 + n:]], dim=1) + model.positional_embedding
    for k, block in enumerate(model.transformer.resblocks, start=1):
        if 2 <= k <= len(deep) + 1:
            x = torch.cat([x[:, :1], deep[k - 2].expand(rows, -1, -1), x[:, 1 + n:]], dim=1)
        x = block(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)
    return x[torch.arange(rows), token_ids.argmax(dim=-1)] @ model.text_projection


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_vision_plan_follows_the_spec(tiny, depth):
    model, runner, _ = tiny
    torch.manual_seed(depth)
    prompts = prompt_parameters(depth, 3, 64, std=0.5)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = runner.visual(images, vision_prompt_plan(prompts))
        expected = spec_image_features(model.visual, images, list(prompts))
    assert ours.tokens.shape == (2, 17 + 3, 64)  # prompts after the 1 + 16 original tokens
    torch.testing.assert_close(ours.features, expected, **TOL)


def test_no_vision_prompts_is_the_plain_tower(tiny):
    model, runner, _ = tiny
    images = torch.randn(2, 3, 32, 32)
    plan = vision_prompt_plan(prompt_parameters(0, 2, 64))
    assert plan.first_layer(3) == 3  # nothing to do
    with torch.no_grad():
        torch.testing.assert_close(runner.encode_image(images, plan), model.encode_image(images), **TOL)


@pytest.mark.parametrize("depth", [1, 2])
def test_text_plan_follows_the_spec(tiny, depth):
    model, runner, tokenizer = tiny
    torch.manual_seed(depth)
    context = TextContext(runner.text, tokenizer, CLASSNAMES, n_ctx=2)
    context.ctx.data.normal_(std=0.5)
    deep = prompt_parameters(depth - 1, 2, 32, std=0.5)
    with torch.no_grad():
        ours = runner.text(embeddings=context(), eot=context.eot, plan=text_prompt_plan(deep)).features
        expected = spec_text_features(model, context.token_ids, context.ctx, list(deep))
    torch.testing.assert_close(ours, expected, **TOL)


def test_prompt_parameters_are_small_gaussians():
    torch.manual_seed(0)
    prompts = prompt_parameters(3, 50, 40)
    assert len(prompts) == 3 and all(p.shape == (50, 40) and p.requires_grad for p in prompts)
    stds = [float(p.detach().std()) for p in prompts]
    assert all(abs(s - 0.02) < 0.002 for s in stds)
    assert not torch.equal(prompts[0], prompts[1])


def test_encode_sentences_matches_encode_text_without_caching(tiny):
    model, runner, tokenizer = tiny
    ids = tokenizer(["a photo of a cat.", "a red star."])
    wrapper = PromptedCLIP(runner)
    runner.text.clear_cache()
    with torch.no_grad():
        torch.testing.assert_close(wrapper.encode_sentences(ids), model.encode_text(ids), **TOL)
    assert len(runner.text._prefix_cache) == 0


def test_tower_depths_from_open_clip_configs(tiny_clip_files):
    assert tower_depths("ViT-B/16") == (12, 12)
    assert tower_depths("ViT-L/14") == (24, 12)
    assert tower_depths("RN50") == (0, 12)
    assert tower_depths(tiny_clip_files[0]) == (3, 2)


def test_depth_checks_name_the_key_and_the_limit():
    check_prompt_depth("TRAINER.X.DEPTH", 12, 12, 1, "text", "ViT-B/16")
    with pytest.raises(ConfigError, match=r"TRAINER\.X\.DEPTH must be between 1 and 12, got 13\. The text tower of ViT-B/16 has 12 layers"):
        check_prompt_depth("TRAINER.X.DEPTH", 13, 12, 1, "text", "ViT-B/16")
    with pytest.raises(ConfigError, match="must be between 1 and 12, got 0"):
        check_prompt_depth("TRAINER.X.DEPTH", 0, 12, 1, "text", "ViT-B/16")
    with pytest.raises(ConfigError, match="image tower of RN50 is not a ViT .* or set it to 0"):
        check_prompt_depth("TRAINER.X.DEPTH_VISION", 2, 0, 0, "image", "RN50")
    check_prompt_depth("TRAINER.X.DEPTH_VISION", 0, 0, 0, "image", "RN50")
    check_prompt_depth("TRAINER.X.DEPTH", 40, None, 1, "text", "hf-hub:unknown")  # unknown: no upper bound


def _prompt_cfg(backbone, **node):
    cfg = get_cfg_default()
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.TRAINER.X = CfgNode(node)
    return cfg


def test_prompt_size_checks_cover_each_prompted_tower():
    cfg = _prompt_cfg("ViT-B/16", DEPTH=12, N=2, DEPTH_V=12, N_V=4)
    check_prompt_sizes(cfg, "X", text=("DEPTH", "N"), vision=("DEPTH_V", "N_V"))
    with pytest.raises(ConfigError, match=r"TRAINER\.X\.DEPTH_V must be between 1 and 12, got 13\. The image tower"):
        check_prompt_sizes(_prompt_cfg("ViT-B/16", DEPTH_V=13, N_V=2), "X", vision=("DEPTH_V", "N_V"))
    with pytest.raises(ConfigError, match=r"TRAINER\.X\.DEPTH must be between 1 and 12, got 13\. The text tower"):
        check_prompt_sizes(_prompt_cfg("ViT-B/16", DEPTH=13, N=0), "X", text=("DEPTH", "N"), vision=("DEPTH", "N"))
    with pytest.raises(ConfigError, match=r"TRAINER\.X\.N must be at least 1, got 0"):
        check_prompt_sizes(_prompt_cfg("ViT-B/16", DEPTH=3, N=0), "X", text=("DEPTH", "N"), vision=("DEPTH", "N"))
    with pytest.raises(ConfigError, match="image tower of RN50 is not a ViT"):
        check_prompt_sizes(_prompt_cfg("RN50", DEPTH=1, N=2), "X", text=("DEPTH", "N"), vision=("DEPTH", "N"))
    check_prompt_sizes(_prompt_cfg("RN50", DEPTH=1, N=2), "X", text=("DEPTH", "N"))  # the text tower alone is fine


def test_default_loss_is_cross_entropy_of_the_logits():
    class FixedLogits(PromptedCLIP):
        def forward(self, images):
            return images.flatten(1)[:, :3] * 2.0

    images = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 2, 1, 2])
    total, logits, terms = FixedLogits(clip=None).loss(images, labels)
    torch.testing.assert_close(logits, images.flatten(1)[:, :3] * 2.0)
    torch.testing.assert_close(total, torch.nn.functional.cross_entropy(logits, labels))
    assert terms == {}


def test_context_init_needs_as_many_tokens_as_vectors():
    check_context_init("N", 4, "INIT", "a photo of a", "ViT-B/16")
    check_context_init("N", 2, "INIT", "a photo of a", "ViT-B/16")
    check_context_init("N", 8, "INIT", "a photo", "ViT-B/16")  # > 4: random init, phrase unused
    check_context_init("N", 4, "INIT", "", "ViT-B/16")
    with pytest.raises(ConfigError, match='N is 3, but INIT "a photo" has only 2 tokens'):
        check_context_init("N", 3, "INIT", "a photo", "ViT-B/16")


def test_choice_and_range_checks():
    check_choice("K", "fp16", ("fp16", "fp32"))
    with pytest.raises(ConfigError, match=r"K must be one of \['fp16', 'fp32'\], got 'fp8'\."):
        check_choice("K", "fp8", ("fp16", "fp32"))
    check_range("K", 3, 1, 3)
    with pytest.raises(ConfigError, match="K must be at least 1, got 0. Because."):
        check_range("K", 0, minimum=1, why="Because.")
    with pytest.raises(ConfigError, match="K must be at most 2, got 5"):
        check_range("K", 5, maximum=2)


class _Holder(nn.Module):
    """IVLP-shaped stand-in: a text context parameter and deep prompts."""

    def __init__(self):
        super().__init__()
        self.prompt_learner = nn.Module()
        self.prompt_learner.ctx = nn.Parameter(torch.zeros(2, 4))
        self.text_prompts = prompt_parameters(1, 2, 4)
        self.vision_prompts = prompt_parameters(2, 2, 6)
        read_reference_checkpoints(self)


def test_reference_checkpoints_are_renamed_and_frozen_weights_skipped(capsys):
    holder = _Holder()
    reference = {
        "prompt_learner.ctx": torch.full((2, 4), 1.0),
        "image_encoder.VPT": torch.full((2, 6), 2.0),
        "image_encoder.transformer.resblocks.1.VPT_shallow": torch.full((2, 6), 3.0),
        "text_encoder.transformer.resblocks.1.VPT_shallow": torch.full((2, 4), 4.0),
        "image_encoder.conv1.weight": torch.zeros(3),
        "text_encoder.positional_embedding": torch.zeros(3),
        "logit_scale": torch.zeros(()),
        "prompt_learner.ZS_image_encoder.proj": torch.zeros(3),
    }
    result = holder.load_state_dict(reference, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(holder.vision_prompts[0], reference["image_encoder.VPT"])
    assert torch.equal(holder.vision_prompts[1], reference["image_encoder.transformer.resblocks.1.VPT_shallow"])
    assert torch.equal(holder.text_prompts[0], reference["text_encoder.transformer.resblocks.1.VPT_shallow"])
    assert torch.equal(holder.prompt_learner.ctx, reference["prompt_learner.ctx"])
    assert "skipped its 4 frozen CLIP tensors" in capsys.readouterr().out
    # Our own layout loads unchanged, silently.
    holder.load_state_dict(_Holder().state_dict())
    assert capsys.readouterr().out == ""
