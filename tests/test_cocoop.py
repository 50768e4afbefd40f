"""CoCoOp: per-image conditional prompts, chunked text passes."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import tiny_node, tiny_runner, toy_world  # noqa: F401

from vlprompt.methods.conditional_context import CoCoOpCLIP
from vlprompt.methods.text_context import CoOpCLIP

CLASSNAMES = ["abyssinian", "american bulldog", "bengal", "red star", "cat"]
TOL = dict(rtol=1e-5, atol=1e-5)


def build(tiny_runner, **node):  # noqa: F811
    runner, tokenizer = tiny_runner
    torch.manual_seed(0)
    model = CoCoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("CoCoOp", **node))
    with torch.no_grad():  # a meta-net whose shifts matter
        for parameter in model.prompt_learner.meta_net.parameters():
            parameter.normal_(std=0.5)
    return model.eval()


def test_logits_follow_the_reference_loop(tiny_runner):  # noqa: F811
    """Image by image as the reference: ctx + meta_net(normalised f_b), all classes' prompts,
    logits_b = 100 f_b . normalised text features."""
    model = build(tiny_runner)
    images = torch.randn(3, 3, 32, 32)
    prompts = model.prompt_learner
    with torch.no_grad():
        features = F.normalize(model.clip.encode_image(images), dim=-1)
        expected = []
        for f in features:
            context = prompts.ctx + prompts.meta_net(f)
            text = model.clip.text(embeddings=prompts(context), eot=prompts.eot).features
            expected.append(model.logit_scale * F.normalize(text, dim=-1) @ f)
        torch.testing.assert_close(model(images), torch.stack(expected), **TOL)


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunk_size_does_not_change_the_logits(tiny_runner, chunk):  # noqa: F811
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = build(tiny_runner, TEXT_CHUNK_SIZE=15)(images)  # one pass: 3 images x 5 classes
        # Equal up to float32 rounding: each pass computes text positions up to its own
        # longest sentence, so the matrix shapes (and summation orders) differ by chunk.
        torch.testing.assert_close(build(tiny_runner, TEXT_CHUNK_SIZE=chunk)(images), reference, **TOL)


def test_chunked_training_gradients_equal_one_pass(tiny_runner):  # noqa: F811
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 3])
    grads = []
    for chunk in (3, 10):
        model = build(tiny_runner, TEXT_CHUNK_SIZE=chunk).train()
        loss, _, _ = model.loss(images, labels)
        loss.backward()
        grads.append([p.grad.clone() for p in model.prompt_learner.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL)


def test_zeroed_meta_net_is_coop_with_the_same_context(tiny_runner):  # noqa: F811
    """With a zero meta-net output CoCoOp is CoOp; with "a photo of a" the text
    features at step 0 are the frozen CLIP features of the sentences."""
    runner, tokenizer = tiny_runner
    model = build(tiny_runner)
    with torch.no_grad():
        for parameter in model.prompt_learner.meta_net.linear2.parameters():
            parameter.zero_()
    coop = CoOpCLIP(runner, tokenizer, CLASSNAMES, tiny_node("CoOp")).eval()
    assert torch.equal(coop.prompt_learner.ctx, model.prompt_learner.ctx)
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images), coop(images), **TOL)
        sentences = tokenizer([f"a photo of a {name}." for name in CLASSNAMES])
        frozen = F.normalize(runner.encode_text(sentences), dim=-1)
        torch.testing.assert_close(coop.class_text_features(), frozen, **TOL)


def test_context_is_conditioned_per_image(tiny_runner):  # noqa: F811
    model = build(tiny_runner)
    features = F.normalize(torch.randn(2, 32), dim=-1)
    contexts = model.prompt_learner.conditioned(features)
    assert contexts.shape == (2, 4, 32)
    shift = contexts - model.prompt_learner.ctx
    torch.testing.assert_close(shift[:, 0], shift[:, 3])  # the same shift for all n vectors
    assert not torch.allclose(shift[0], shift[1])
