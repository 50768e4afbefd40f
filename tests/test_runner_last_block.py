"""The last block of each tower computes only the rows that are pooled or asked for.

Counted in actual forwards: a hook on the last block's MLP records how many query rows
per sequence enter it ([B, R, D] -> R); attention, residual and MLP all run on those rows.
"""
import os
from contextlib import contextmanager

import open_clip
import pytest
import torch

from vlprompt.clip import CLIPRunner, InsertTokens, MapTokens, Plan, ReplaceTokens, Tokenizer, load_clip

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny(tiny_clip_files):
    config, weights = tiny_clip_files
    model, _ = load_clip(config, weights)
    reference = open_clip.create_model(os.path.splitext(os.path.basename(config))[0], pretrained=weights).eval()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(3, 3, 32, 32, generator=generator)
    ids = Tokenizer(config)(["a photo of a dog.", "a red star", "itap of a very small striped hexagon."])
    return CLIPRunner(model), reference, images, ids


@contextmanager
def last_block_rows(tower):
    """Yields a list that receives the number of rows per sequence of every call of the
    tower's last block's MLP."""
    rows = []
    handle = tower.blocks[-1].mlp.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    try:
        yield rows
    finally:
        handle.remove()


def deep_plan(width, layer=1):
    """Edits of an earlier layer: two prompts appended at block ``layer``."""
    return Plan(layers={layer: InsertTokens(torch.randn(2, width))})


def test_empty_plan_image_last_block_computes_the_class_token_only(tiny):
    runner, reference, images, _ = tiny
    with torch.no_grad(), last_block_rows(runner.visual) as rows:
        features = runner.encode_image(images)
        plain = runner.encode_image_plain(images)
    assert rows == [1, 1]
    torch.testing.assert_close(features, reference.encode_image(images), **TOL)
    torch.testing.assert_close(plain, reference.encode_image(images), **TOL)


def test_image_plan_on_earlier_layers_last_block_computes_the_class_token_only(tiny):
    runner, _, images, _ = tiny
    plan = deep_plan(runner.visual.width)
    with torch.no_grad(), last_block_rows(runner.visual) as rows:
        features = runner.encode_image(images, plan)
        every = runner.visual(images, plan)
    assert rows == [1, 17 + 2]  # rows=None asks for every final token
    torch.testing.assert_close(features, every.features, **TOL)


def test_image_rows_asked_for_are_still_computed(tiny):
    """A plan's extra token states (DeAR's attribute tokens) come from the last block."""
    runner, _, images, _ = tiny
    plan = deep_plan(runner.visual.width, layer=runner.visual.num_layers - 1)
    with torch.no_grad(), last_block_rows(runner.visual) as rows:
        some = runner.visual(images, plan, rows=[17, 18])
        with_class = runner.visual(images, plan, rows=[0, 18])
        every = runner.visual(images, plan)
        prefix = runner.visual.shared_prefix(images, 1)
        frozen = runner.visual(prefix=prefix, rows=())
    assert rows == [3, 2, 19, 1]  # the class token is pooled whether asked for or not, and computed once
    torch.testing.assert_close(some.tokens, every.tokens[:, [17, 18]], **TOL)
    torch.testing.assert_close(with_class.tokens, every.tokens[:, [0, 18]], **TOL)
    torch.testing.assert_close(frozen.features, runner.encode_image(images), **TOL)


def test_empty_plan_text_last_block_computes_the_pooled_tokens_only(tiny):
    runner, reference, _, ids = tiny
    runner.text.clear_cache()
    with torch.no_grad(), last_block_rows(runner.text) as rows:
        first = runner.encode_text(ids)
        cached = runner.encode_text(ids)  # the frozen result of every block is cached
        every = runner.text(ids, all_tokens=True)
    eot = ids.argmax(-1)
    assert rows == [1, int(eot.max()) + 1]
    expected = reference.encode_text(ids)
    torch.testing.assert_close(first, expected, **TOL)
    torch.testing.assert_close(cached, first, rtol=0, atol=0)
    torch.testing.assert_close(every.features, expected, **TOL)
    assert every.tokens.shape[1] == int(eot.max()) + 1


@pytest.mark.parametrize("layer", [0, 1])
def test_text_plan_on_earlier_layers_last_block_computes_the_pooled_tokens_only(tiny, layer):
    runner, reference, _, ids = tiny
    same_words = ReplaceTokens(runner.text.embed(ids)[:, 1:3], at=1)  # an embedding edit that changes nothing
    plans = [Plan(layers={layer: MapTokens(lambda x: x)}), Plan(embed=[same_words])]
    with torch.no_grad(), last_block_rows(runner.text) as rows:
        outputs = [runner.text(ids, plan) for plan in plans]
        embedded = runner.text(embeddings=runner.text.embed(ids), eot=ids.argmax(-1))
    assert rows == [1, 1, 1]
    for out in [*outputs, embedded]:
        assert out.tokens.shape == (3, 1, 32)
        torch.testing.assert_close(out.features, reference.encode_text(ids), **TOL)
