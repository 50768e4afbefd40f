"""Image preprocessing from the backbone (vlprompt/clip/preprocess.py): the INPUT keys a config
leaves empty take the backbone's values, which are read from open_clip's configs without
building any model; a value a config gives wins; the configs of the OpenAI family resolve to
exactly the values they wrote before; the test transform follows INPUT.RESIZE_MODE.
"""
import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

import config_snapshot as snap
from vlprompt.clip.preprocess import backbone_preprocess, resolve_input
from vlprompt.config import get_cfg_default, merge_from_file, merge_from_list
from vlprompt.testing import FAMILY_TEST_CONFIGS, TINY_CLIP_CONFIG

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]
# What configs/trainers/_base_/clip.yaml wrote for every config of configs/trainers before the
# preprocessing came from the backbone, and the test transform there was (shortest edge, center crop).
OPENAI_FAMILY_BEFORE = {"SIZE": (224, 224), "INTERPOLATION": "bicubic", "PIXEL_MEAN": CLIP_MEAN,
                        "PIXEL_STD": CLIP_STD, "RESIZE_MODE": "shortest"}


def values(preprocess):
    return {key: item.value for key, item in preprocess.items()}


@pytest.mark.parametrize("name, weights, expected, source", [
    ("ViT-B-16-SigLIP2", "webli", ((224, 224), "bicubic", HALF, HALF, "squash"), "ViT-B-16-SigLIP2, tag webli"),
    ("ViT-B-16-SigLIP2", "random", ((224, 224), "bicubic", HALF, HALF, "squash"),
     "every pretrained tag of ViT-B-16-SigLIP2 shares (webli); weights 'random' have no tag"),
    ("ViT-SO400M-14-SigLIP-384", "webli", ((384, 384), "bicubic", HALF, HALF, "squash"), "tag webli"),
    ("PE-Core-T-16-384", "meta", ((384, 384), "bilinear", HALF, HALF, "squash"), "PE-Core-T-16-384, tag meta"),
    ("PE-Core-T-16-384", "random", ((384, 384), "bilinear", HALF, HALF, "squash"), "shares (meta)"),
    ("EVA02-B-16", "merged2b_s8b_b131k", ((224, 224), "bicubic", CLIP_MEAN, CLIP_STD, "shortest"),
     "tag merged2b_s8b_b131k"),
    ("ViT-B/16", "", ((224, 224), "bicubic", CLIP_MEAN, CLIP_STD, "shortest"), "ViT-B-16, tag openai"),
    ("ViT-B/16", "/models/ViT-B-16.pt", ((224, 224), "bicubic", CLIP_MEAN, CLIP_STD, "shortest"), "tag openai"),
])
def test_each_family_preprocesses_as_its_open_clip_config(name, weights, expected, source):
    found = backbone_preprocess(name, weights)
    assert tuple(values(found).values()) == expected
    assert source in found["PIXEL_MEAN"].source and source in found["RESIZE_MODE"].source
    assert found["SIZE"].source.startswith("the image tower's input size (vision_cfg.image_size")


def test_tags_that_disagree_leave_open_clips_defaults():
    """ViT-L-14's tags normalise differently: without a tag its mean and std are open_clip's defaults,
    while the interpolation its tags share is kept."""
    found = backbone_preprocess("ViT-L-14", "random")
    assert (found["PIXEL_MEAN"].value, found["PIXEL_MEAN"].source) == (CLIP_MEAN, "open_clip's defaults")
    assert found["INTERPOLATION"].source.startswith("the value every pretrained tag of ViT-L-14 shares")


def test_the_tiny_synthetic_clip_keeps_32_pixels_and_clips_statistics():
    found = backbone_preprocess("configs/clip/tiny-synthetic-clip.json", "weights/tiny-synthetic-clip.pt")
    assert values(found) == {"SIZE": (32, 32), "INTERPOLATION": "bicubic", "PIXEL_MEAN": CLIP_MEAN,
                             "PIXEL_STD": CLIP_STD, "RESIZE_MODE": "shortest"}
    assert found["PIXEL_MEAN"].source == "open_clip's defaults"


def test_a_model_config_json_gives_its_preprocess_cfg_and_a_timm_tower_its_statistics(tmp_path):
    own = dict(FAMILY_TEST_CONFIGS["siglip"], preprocess_cfg={"mean": HALF, "std": HALF, "resize_mode": "squash"})
    path = tmp_path / "tiny-own-preprocess-clip.json"
    path.write_text(json.dumps(own), encoding="utf-8")
    found = backbone_preprocess(str(path), "random")
    assert values(found) == {"SIZE": (32, 32), "INTERPOLATION": "bicubic", "PIXEL_MEAN": HALF, "PIXEL_STD": HALF,
                             "RESIZE_MODE": "squash"}
    assert found["PIXEL_MEAN"].source == f"preprocess_cfg of the model config {path}"
    assert found["INTERPOLATION"].source == "open_clip's defaults"
    timm_tower = copy.deepcopy(FAMILY_TEST_CONFIGS["siglip"])
    timm_tower["vision_cfg"].update(timm_model_name="vit_base_patch16_siglip_224", image_size=224)
    path = tmp_path / "siglip-timm-tower.json"
    path.write_text(json.dumps(timm_tower), encoding="utf-8")
    found = backbone_preprocess(str(path), "random")
    assert (found["PIXEL_STD"].value, found["RESIZE_MODE"].value, found["SIZE"].value) == (HALF, "shortest", (224, 224))
    assert found["PIXEL_STD"].source == "the pretrained config of the timm image tower vit_base_patch16_siglip_224"


def coop_cfg(*opts):
    cfg = snap.default_config()
    merge_from_file(cfg, "configs/trainers/CoOp/vit_b16_ep50.yaml")
    merge_from_list(cfg, list(opts))
    return cfg


def test_a_value_the_config_gives_wins_and_the_log_says_where_each_came_from():
    cfg = coop_cfg("MODEL.BACKBONE.NAME", "ViT-B-16-SigLIP2", "MODEL.BACKBONE.WEIGHTS", "webli",
                   "INPUT.PIXEL_MEAN", "[0.4, 0.4, 0.4]", "INPUT.RESIZE_MODE", "shortest")
    cfg.freeze()
    resolved, lines = resolve_input(cfg)
    assert resolved is not cfg and resolved.is_frozen() and cfg.INPUT.SIZE == ()
    assert (resolved.INPUT.SIZE, resolved.INPUT.INTERPOLATION, resolved.INPUT.PIXEL_MEAN, resolved.INPUT.PIXEL_STD,
            resolved.INPUT.RESIZE_MODE) == ((224, 224), "bicubic", [0.4, 0.4, 0.4], HALF, "shortest")
    tag = "open_clip's pretrained config of ViT-B-16-SigLIP2, tag webli"
    assert lines == [
        "Image preprocessing (empty INPUT keys come from the backbone ViT-B-16-SigLIP2):",
        "  INPUT.SIZE (224, 224): the image tower's input size (vision_cfg.image_size of ViT-B-16-SigLIP2)",
        f"  INPUT.INTERPOLATION bicubic: {tag}",
        "  INPUT.PIXEL_MEAN [0.4, 0.4, 0.4]: set by the config",
        f"  INPUT.PIXEL_STD [0.5, 0.5, 0.5]: {tag}",
        "  INPUT.RESIZE_MODE shortest: set by the config",
    ]
    again, _ = resolve_input(resolved)
    assert again is resolved  # resolved once; later calls keep the config as it is


def test_without_a_backbone_the_empty_keys_take_dassls_defaults():
    resolved, lines = resolve_input(get_cfg_default())
    assert (resolved.INPUT.SIZE, resolved.INPUT.INTERPOLATION, resolved.INPUT.PIXEL_MEAN,
            resolved.INPUT.RESIZE_MODE) == ((224, 224), "bilinear", [0.485, 0.456, 0.406], "shortest")
    assert lines[1] == "  INPUT.SIZE (224, 224): Dassl's default (no MODEL.BACKBONE.NAME)"


@pytest.fixture(scope="module")
def toy_backbone(tmp_path_factory):
    """The toy configs name output/toy/tiny-clip.json, which tools/make_toy_setup.py writes: its model
    config (no weights are needed to read the preprocessing)."""
    path = tmp_path_factory.mktemp("toy") / "tiny-clip.json"
    path.write_text(json.dumps(TINY_CLIP_CONFIG), encoding="utf-8")
    return str(path)


def test_every_config_naming_a_backbone_resolves_to_the_values_it_had(toy_backbone):
    """The snapshot holds each shipped config's merged values (tests/test_config_snapshot.py checks them);
    resolved, every config that names a backbone (OpenAI's ViT-B/16, RN50, ..., the two tiny synthetic
    backbones and the toy CLIP) has the preprocessing it had when configs/trainers/_base_/clip.yaml wrote it."""
    changes = snap.load_changes(snap.ROOT / "tests" / "fixtures" / "merged_configs_changes.yaml")
    applied, _ = snap.apply_changes(snap.load_snapshot(), changes)
    names = set()
    for path, flat in sorted(applied["files"].items()):
        name = flat["MODEL.BACKBONE.NAME"]
        if not name:
            continue
        names.add(name)
        cfg = get_cfg_default()
        cfg.MODEL.BACKBONE.NAME = toy_backbone if name == "output/toy/tiny-clip.json" else name
        cfg.MODEL.BACKBONE.WEIGHTS = flat["MODEL.BACKBONE.WEIGHTS"]
        for key in OPENAI_FAMILY_BEFORE:
            value = flat[f"INPUT.{key}"]
            cfg.INPUT[key] = tuple(value) if key == "SIZE" else value
        resolved = resolve_input(cfg)[0].INPUT
        expected = {key: snap.plain(flat[f"INPUT.{key}"] or value) for key, value in OPENAI_FAMILY_BEFORE.items()}
        assert {key: snap.plain(resolved[key]) for key in expected} == expected, path
    assert names == {"ViT-B/16", "ViT-B/32", "ViT-L/14", "RN50", "RN101", "configs/clip/tiny-synthetic-clip.json",
                     "configs/clip/tiny-synthetic-eva02.json", "output/toy/tiny-clip.json"}


def bands():
    """A 40 x 20 (width x height) image: columns 0-9 white, 10-29 gray, 30-39 black."""
    pixels = np.zeros((20, 40, 3), dtype=np.uint8)
    pixels[:, :10], pixels[:, 10:30] = 255, 128
    return Image.fromarray(pixels)


WHITE, GRAY, BLACK = 1.0, 128 / 255, 0.0


@pytest.mark.parametrize("mode, rows, columns", [
    ("shortest", range(8), [GRAY] * 8),  # the center 8 x 8 crop of the 16 x 8 resize
    ("squash", range(8), [WHITE] * 2 + [GRAY] * 4 + [BLACK] * 2),  # the whole image squeezed to 8 x 8
    ("longest", range(2, 6), [WHITE] * 2 + [GRAY] * 4 + [BLACK] * 2),  # 8 x 4, black rows above and below
])
def test_the_test_transform_follows_the_resize_mode(mode, rows, columns):
    from vlprompt.data.transforms import build_transform

    cfg = get_cfg_default()
    cfg.INPUT.SIZE, cfg.INPUT.INTERPOLATION, cfg.INPUT.RESIZE_MODE = (8, 8), "nearest", mode
    image = build_transform(cfg, is_train=False)(bands())
    assert image.shape == (3, 8, 8)
    torch.testing.assert_close(image[0, list(rows)], torch.tensor([columns] * len(rows)), rtol=0, atol=1e-6)
    if mode == "longest":
        assert image[:, [0, 1, 6, 7]].abs().max() == 0
