"""The text tower's frozen-prefix cache: a repeated lookup with the same token-id tensor
reads nothing back from the device; changed or different token ids never hit a stale entry;
the cache stays bounded."""
import os

import open_clip
import pytest
import torch
from torch.overrides import TorchFunctionMode

from vlprompt.clip import CLIPRunner, MapTokens, Plan, TextTower, Tokenizer, load_clip

TOL = dict(rtol=1e-5, atol=1e-5)
# Tensor methods and functions that copy values to the host (a device sync on an accelerator).
HOST_READS = {"cpu", "numpy", "item", "tolist", "__int__", "__float__", "__bool__", "__index__", "equal"}
SENTENCES = ["a photo of a dog.", "a red star", "itap of a very small striped hexagon."]


class HostReads(TorchFunctionMode):
    """Records every call that reads tensor values back to the host."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        to_device = name in ("to", "copy_") and (
            "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:]))
        if name in HOST_READS or to_device:
            self.calls.append(name)
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny(tiny_clip_files):
    config, weights = tiny_clip_files
    model, _ = load_clip(config, weights)
    reference = open_clip.create_model(os.path.splitext(os.path.basename(config))[0], pretrained=weights).eval()
    return model, reference, Tokenizer(config)


def test_recorder_sees_the_reads_of_a_host_side_key():
    ids = torch.tensor([[1, 5, 2]])
    with HostReads() as reads:
        hash(ids.cpu().numpy().tobytes()), int(ids.argmax(-1).max())
    assert reads.calls == ["cpu", "numpy", "__int__"]


def test_repeated_lookup_reads_nothing_from_the_device(tiny):
    model, _, tokenizer = tiny
    text = CLIPRunner(model).text
    ids = tokenizer(SENTENCES)
    plan = Plan(layers={1: MapTokens(lambda x: x)})
    with torch.no_grad():
        prefix, features, planned = text.prefix(ids, 1), text(ids).features, text(ids, plan).features
        with HostReads() as reads:
            prefix_again = text.prefix(ids, 1)
            features_again = text(ids).features
            planned_again = text(ids, plan).features
    assert reads.calls == []
    assert prefix_again is prefix
    torch.testing.assert_close(features_again, features, rtol=0, atol=0)
    torch.testing.assert_close(planned_again, planned, rtol=0, atol=0)


def test_token_ids_changed_in_place_miss_the_cache(tiny):
    model, reference, tokenizer = tiny
    text = CLIPRunner(model).text
    ids = tokenizer(SENTENCES)
    with torch.no_grad():
        before = text.prefix(ids, 1)
        text(ids)
        ids[0, 1:3] = ids[2, 1:3]  # other words, same end-of-text positions
        after = text.prefix(ids, 1)
        features = text(ids).features
        expected = reference.encode_text(ids)
    assert after is not before
    torch.testing.assert_close(after, text._compute_prefix(ids, 1), rtol=0, atol=0)
    torch.testing.assert_close(features, expected, **TOL)


def test_new_token_ids_with_other_content_miss_and_equal_content_hits(tiny):
    model, reference, tokenizer = tiny
    text = CLIPRunner(model).text
    ids, other = tokenizer(SENTENCES), tokenizer(["a photo of a cat.", "a blue star", "itap of a very large dotted hexagon."])
    assert other.shape == ids.shape and not torch.equal(other, ids)
    with torch.no_grad():
        first = text.prefix(ids, 1)
        assert text.prefix(other, 1) is not first
        assert text.prefix(ids.clone(), 1) is first
        torch.testing.assert_close(text(other).features, reference.encode_text(other), **TOL)
        torch.testing.assert_close(text(ids.clone()).features, reference.encode_text(ids), **TOL)


def test_cache_is_bounded(tiny):
    model, _, tokenizer = tiny
    text = TextTower(model, cache_size=2)
    with torch.no_grad():
        for index in range(5):
            ids = tokenizer([f"{'a ' * index}photo of a dog."])
            torch.testing.assert_close(text.prefix(ids, 1), text._compute_prefix(ids, 1), rtol=0, atol=0)
            assert len(text._prefix_cache) == min(index + 1, 2)
            assert len(text._host_values) <= 2


def test_values_of_a_freed_tensor_are_forgotten(tiny):
    """Pooled positions built anew each step (CoCoOp's ``eot[classes]``) do not crowd out
    the entries of the tensors a method keeps."""
    model, _, tokenizer = tiny
    text = TextTower(model, cache_size=2)
    ids = tokenizer(SENTENCES)
    with torch.no_grad():
        text.prefix(ids, 1)
        for _ in range(3):
            text(embeddings=text.embed(ids), eot=ids.argmax(-1))
        assert len(text._host_values) == 1
        with HostReads() as reads:
            text.prefix(ids, 1)
    assert reads.calls == []
