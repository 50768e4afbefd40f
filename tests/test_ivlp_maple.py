"""Structural equivalences of IVLP and MaPLe."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, learnable, make_cfg, tiny_node, tiny_runner, toy_world  # noqa: F401

from vlprompt.clip import CLIPRunner, Tokenizer, load_clip, vision_prompt_plan
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.independent_prompts import IVLPCLIP
from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip

CLASSNAMES = ["abyssinian", "american bulldog", "bengal"]
TOL = dict(rtol=1e-5, atol=1e-5)


def sentence_features(tiny_runner, phrase):  # noqa: F811
    runner, tokenizer = tiny_runner
    with torch.no_grad():
        return F.normalize(runner.encode_text(tokenizer([f"{phrase} {name}." for name in CLASSNAMES])), dim=-1)


def context_trajectory(cfg):
    """Build the trainer seeded as train.py does and train one epoch batch by batch:
    the text context after every step."""
    trainer = build_seeded(cfg)
    trainer.num_batches = len(trainer.train_loader_x)
    trainer.set_model_mode("train")
    trajectory = [trainer.model.prompt_learner.ctx.detach().clone()]
    for trainer.batch_idx, batch in enumerate(trainer.train_loader_x):
        trainer.forward_backward(batch)
        trajectory.append(trainer.model.prompt_learner.ctx.detach().clone())
    return trainer, trajectory


def test_ivlp_depth_one_without_vision_prompts_trains_exactly_like_coop(toy_world, tmp_path):  # noqa: F811
    """IVLP with text depth 1, vision depth 0 and 4 "a photo of a" tokens is CoOp ctxv1."""
    node = {"N_CTX_TEXT": 4, "PROMPT_DEPTH_TEXT": 1, "PROMPT_DEPTH_VISION": 0}
    ivlp, ivlp_steps = context_trajectory(make_cfg(toy_world, "IVLP", tmp_path / "ivlp", node=node, OPTIM__WARMUP_EPOCH=0))
    _, coop_steps = context_trajectory(make_cfg(toy_world, "CoOp", tmp_path / "coop", OPTIM__WARMUP_EPOCH=0))
    assert list(learnable(ivlp.model)) == ["prompt_learner.ctx"]
    assert len(ivlp_steps) == 4 and not torch.equal(ivlp_steps[0], ivlp_steps[-1])
    for ours, coop in zip(ivlp_steps, coop_steps):
        assert torch.equal(ours, coop)


def test_ivlp_shallow_text_path_reproduces_the_sentence(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    node = tiny_node("IVLP", N_CTX_TEXT=4, PROMPT_DEPTH_TEXT=1, PROMPT_DEPTH_VISION=0)
    model = IVLPCLIP(runner, tokenizer, CLASSNAMES, node).eval()
    with torch.no_grad():
        torch.testing.assert_close(model.class_text_features(), sentence_features(tiny_runner, "a photo of a"), **TOL)
        images = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(model.image_features(images), F.normalize(runner.encode_image(images), dim=-1), **TOL)


@pytest.fixture(scope="module")
def deeper_runner(tmp_path_factory):
    """A tiny CLIP with 3 text layers, so MaPLe can have depth 3 (two deep couplings)."""
    config = {**TINY_CLIP_CONFIG, "text_cfg": {**TINY_CLIP_CONFIG["text_cfg"], "layers": 3}}
    files = write_tiny_clip(str(tmp_path_factory.mktemp("deeper")), name="tiny-clip-deeper", config=config)
    model, _ = load_clip(*files)
    return CLIPRunner(model), Tokenizer(files[0])


def test_maple_vision_prompts_are_the_coupling_of_its_text_prompts(deeper_runner):
    runner, tokenizer = deeper_runner
    torch.manual_seed(0)
    model = MaPLeCLIP(runner, tokenizer, CLASSNAMES, tiny_node("MaPLe", PROMPT_DEPTH=3))
    prompts = model.prompt_learner
    # Deep couplings start as identical copies; the shallow one is a separate layer.
    first, second = prompts.compound_prompt_projections
    assert torch.equal(first.weight, second.weight) and torch.equal(first.bias, second.bias)
    assert not torch.equal(prompts.proj.weight, first.weight)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.3 * torch.randn_like(parameter))
    coupled = [prompts.proj(prompts.ctx), first(prompts.compound_prompts_text[0]), second(prompts.compound_prompts_text[1])]
    images = torch.randn(2, 3, 32, 32)
    expected = F.normalize(runner.encode_image(images, vision_prompt_plan(coupled)), dim=-1)
    features = model.image_features(images)
    torch.testing.assert_close(features, expected, **TOL)
    # The image loss reaches every text prompt through the couplings.
    features.sum().backward()
    for tensor in (prompts.ctx, *prompts.compound_prompts_text):
        assert tensor.grad is not None and tensor.grad.abs().sum() > 0


def test_maple_keeps_of_a_fixed_and_shallow_text_path_is_the_sentence(tiny_runner):  # noqa: F811
    runner, tokenizer = tiny_runner
    model = MaPLeCLIP(runner, tokenizer, CLASSNAMES, tiny_node("MaPLe", PROMPT_DEPTH=1)).eval()
    prompts = model.prompt_learner
    assert prompts.n_ctx == 2 and prompts.phrase == "a photo of a"
    assert len(prompts.compound_prompts_text) == 0 and len(prompts.compound_prompt_projections) == 0
    with torch.no_grad():
        torch.testing.assert_close(model.class_text_features(), sentence_features(tiny_runner, "a photo of a"), **TOL)
        # positions 3, 4 hold the frozen "of a" embeddings
        of_a = runner.text.embed(tokenizer(["of a"])[0, 1:3])
        torch.testing.assert_close(prompts()[0, 3:5], of_a)
