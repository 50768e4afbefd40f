"""The synthetic world: renderer, captions, pretraining batches and loss."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlprompt.synthetic.captions import attribute_ids, caption, describes
from vlprompt.synthetic.pretraining import make_batch, multi_positive_loss
from vlprompt.synthetic.world import (
    ATTRIBUTES, COLORS, DARK_SHADE, LOCATIONS, SHAPES, SOLID_SHADE, TEXTURES, RenderStyle, Scene, _texture_mask,
    render, sample_scene,
)

PLAIN = RenderStyle(backgrounds=("bright",), rotation=0.0, jitter=0.0, color_jitter=0.0)


def draw(seed=0, style=PLAIN, **attributes):
    scene = Scene(**{"shape": "circle", "color": "red", "texture": "solid", "location": "center",
                     "size": "large", "background": "bright", **attributes})
    return np.asarray(render(scene, np.random.default_rng(seed), style), dtype=np.float32)


def object_mask(image):
    """Pixels clearly darker or more saturated than the pale background."""
    return (image.max(axis=2) - image.min(axis=2) > 60) | (image.mean(axis=2) < 150)


def test_render_is_deterministic_per_seed():
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    scene = sample_scene(np.random.default_rng(1))
    first = np.asarray(render(scene, rng_a))
    assert first.shape == (32, 32, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, np.asarray(render(scene, rng_b)))
    assert not np.array_equal(first, np.asarray(render(scene, np.random.default_rng(8))))


def test_shapes_are_distinct_silhouettes():
    masks = {shape: object_mask(draw(shape=shape)) for shape in SHAPES}
    for shape, mask in masks.items():
        assert 30 < mask.sum() < 32 * 32 - 100, shape
    for i, a in enumerate(SHAPES):
        for b in SHAPES[i + 1:]:
            iou = (masks[a] & masks[b]).sum() / (masks[a] | masks[b]).sum()
            assert iou < 0.9, (a, b, iou)


@pytest.mark.parametrize("color", list(COLORS))
def test_solid_object_has_its_colour_at_the_mean_shade_of_a_pattern(color):
    image = draw(color=color)
    mean = image[object_mask(image)].mean(axis=0)
    distances = {name: np.linalg.norm(mean - SOLID_SHADE * np.array(rgb)) for name, rgb in COLORS.items()}
    assert min(distances, key=distances.get) == color
    patterned = [draw(color=color, texture=texture) for texture in TEXTURES if texture != "solid"]
    for other in patterned:  # same mean colour (up to the anti-aliased border), whatever the pattern
        np.testing.assert_allclose(other[object_mask(image)].mean(axis=0), mean, rtol=0.1, atol=3)


def test_patterns_darken_half_of_each_cell_of_a_lattice_fixed_to_the_image():
    y, x = np.mgrid[0:64, 0:64].astype(np.float32) + 0.5
    for texture in ("striped", "dotted", "checkered"):
        dark = _texture_mask(texture, x, y)
        assert abs(dark.mean() - 0.5) < 0.02, texture
        cells = dark.reshape(4, 16, 4, 16).transpose(0, 2, 1, 3)  # [4, 4, 16, 16]: one per 8x8 image patch
        assert (cells == cells[0, 0]).all(), texture  # every patch holds the same piece of the pattern
    assert not _texture_mask("solid", x, y).any()
    assert DARK_SHADE < SOLID_SHADE < 1.0


@pytest.mark.parametrize("location", [loc for loc in LOCATIONS if loc != "center"])
def test_object_sits_in_its_quadrant(location):
    ys, xs = np.nonzero(object_mask(draw(location=location, size="small")))
    dx, dy = LOCATIONS[location]
    assert np.sign(xs.mean() - 15.5) == dx and np.sign(ys.mean() - 15.5) == dy


def test_textures_change_the_object_pixels():
    solid = draw(texture="solid")
    for texture in ("striped", "dotted", "checkered"):
        textured = draw(texture=texture)
        changed = (np.abs(textured - solid).sum(axis=2) > 60).sum()  # lighter or darker than the solid shade
        assert changed > 100, texture


def test_caption_states_the_mentioned_attribute_values():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scene = sample_scene(rng)
        text, mentioned = caption(scene, rng)
        assert mentioned and set(mentioned) <= set(ATTRIBUTES)
        words = text.split()
        for attribute in ("shape", "color", "size"):
            assert (getattr(scene, attribute) in words) == (attribute in mentioned), (text, mentioned)
        if "location" in mentioned:
            assert scene.location in text or (scene.location == "center" and "middle" in text)


def test_describes_matches_only_stated_attributes():
    red_star = Scene("star", "red", "solid", "center", "small", "plain")
    red_ring = Scene("ring", "red", "dotted", "top left", "large", "noise")
    blue_star = Scene("star", "blue", "solid", "center", "small", "plain")
    ids = attribute_ids([red_star, red_ring, blue_star])
    colour_only = np.array([[a == "color" for a in ATTRIBUTES]])
    truth = describes(ids, ids[:1], colour_only)  # "a red shape", written for the red star
    assert truth[:, 0].tolist() == [True, True, False]
    everything = np.ones((1, len(ATTRIBUTES)), dtype=bool)
    assert describes(ids, ids[:1], everything)[:, 0].tolist() == [True, False, False]


def test_pretraining_batches_are_reproducible_and_consistent():
    import open_clip

    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    first = make_batch(3, 5, 16, tokenizer)
    again = make_batch(3, 5, 16, tokenizer)
    other = make_batch(3, 6, 16, tokenizer)
    assert first["images"].shape == (16, 3, 32, 32) and first["tokens"].shape == (16, 77)
    assert torch.equal(first["images"], again["images"]) and first["captions"] == again["captions"]
    assert not torch.equal(first["images"], other["images"])
    assert first["positives"].diagonal().all()


def test_multi_positive_loss_is_clip_loss_with_one_positive():
    torch.manual_seed(0)
    images, texts = F.normalize(torch.randn(6, 8), dim=-1), F.normalize(torch.randn(6, 8), dim=-1)
    logits = 10.0 * images @ texts.t()
    labels = torch.arange(6)
    clip_loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    loss = multi_positive_loss(images, texts, torch.eye(6, dtype=torch.bool), torch.tensor(10.0))
    torch.testing.assert_close(loss, clip_loss)


def test_multi_positive_loss_spreads_the_target_over_true_captions():
    images = F.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1]]), dim=-1)
    texts = images.clone()
    positives = torch.ones(2, 2, dtype=torch.bool)  # both captions describe both images
    uniform = multi_positive_loss(images, texts, positives, torch.tensor(1.0))
    assert uniform.item() == pytest.approx(np.log(2), abs=1e-2)  # near-equal logits, uniform target
