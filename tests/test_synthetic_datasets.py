"""Synthetic downstream sets: rendered on first use in the CoOp layout, read like real datasets."""
import dataclasses
import json
import os

import numpy as np
import pytest
from mini_datasets import cfg_for
from PIL import Image

import datasets  # noqa: F401  (registers the datasets)
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetLayoutError
from vlprompt.synthetic.downstream import (
    COLOR_SHAPE_CLASSES, SETS, TEXTURE_SHAPE_CLASSES, SetSpec, StaleSyntheticDataError, SynthClass, ensure_dataset,
)
from vlprompt.synthetic.world import COLORS, PRETRAIN_STYLE, SHAPES, TEXTURES, RenderStyle

SMALL = SetSpec(
    "SmallSynth", "small_synth",
    (SynthClass("red star", {"color": "red", "shape": "star"}),
     SynthClass("blue ring", {"color": "blue", "shape": "ring"})),
    RenderStyle(backgrounds=("bright",)), counts=(3, 1, 2), seed=5,
)


def test_ensure_dataset_writes_the_coop_layout_once(tmp_path):
    folder = ensure_dataset(str(tmp_path), SMALL)
    assert folder == str(tmp_path / "small_synth")
    split = json.load(open(tmp_path / "small_synth" / "split_zhou_SmallSynth.json"))
    assert [len(split[p]) for p in ("train", "val", "test")] == [6, 2, 4]
    assert split["train"][0] == ["red_star/train_000.png", 0, "red star"]
    assert split["test"][-1] == ["blue_ring/test_001.png", 1, "blue ring"]
    image = Image.open(tmp_path / "small_synth" / "images" / "red_star" / "train_000.png")
    assert image.size == (32, 32) and image.mode == "RGB"
    stamp = os.path.getmtime(tmp_path / "small_synth" / "split_zhou_SmallSynth.json")
    ensure_dataset(str(tmp_path), SMALL)  # already there: not rendered again
    assert os.path.getmtime(tmp_path / "small_synth" / "split_zhou_SmallSynth.json") == stamp
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


def test_sets_are_identical_on_every_render(tmp_path):
    ensure_dataset(str(tmp_path / "a"), SMALL)
    ensure_dataset(str(tmp_path / "b"), SMALL)
    for name in ("red_star/train_002.png", "blue_ring/test_001.png"):
        a = np.asarray(Image.open(tmp_path / "a" / "small_synth" / "images" / name))
        b = np.asarray(Image.open(tmp_path / "b" / "small_synth" / "images" / name))
        np.testing.assert_array_equal(a, b)


def test_a_set_from_another_generator_is_refused(tmp_path):
    ensure_dataset(str(tmp_path), SMALL)
    with pytest.raises(StaleSyntheticDataError, match=r"seed 5 \(now 6\)\. Delete the folder"):
        ensure_dataset(str(tmp_path), SetSpec(SMALL.name, SMALL.folder, SMALL.classes, SMALL.style,
                                              counts=SMALL.counts, seed=6))


def test_main_set_halves_share_every_colour_and_split_the_shapes():
    names = [c.name for c in COLOR_SHAPE_CLASSES]
    assert len(names) == len(set(names)) == len(COLORS) * len(SHAPES) == 80
    base, new = COLOR_SHAPE_CLASSES[:40], COLOR_SHAPE_CLASSES[40:]
    for half in (base, new):
        assert {c.attributes["color"] for c in half} == set(COLORS)
    assert {c.attributes["shape"] for c in base} == set(SHAPES[0::2])
    assert {c.attributes["shape"] for c in new} == set(SHAPES[1::2])
    assert names[:2] == ["red circle", "red triangle"] and names[40:42] == ["red square", "red star"]
    patterns = TEXTURE_SHAPE_CLASSES
    assert {c.attributes["shape"] for c in patterns[:20]} == set(SHAPES[0::2])
    assert {c.attributes["texture"] for c in patterns[20:]} == set(TEXTURES)


def test_the_discovery_set_is_drawn_as_in_pretraining():
    scenes = SETS["SyntheticScenes"]
    assert scenes.style == PRETRAIN_STYLE and scenes.test_only
    assert [c.attributes for c in scenes.classes] == [{"shape": shape} for shape in SHAPES]
    assert len(set(PRETRAIN_STYLE.sizes)) > 1 and len(set(PRETRAIN_STYLE.backgrounds)) > 1


# The registered sets at their real sizes are rendered by the session's ``synthetic_data`` fixture
# (SyntheticShapes, which the end-to-end tests train on) or, for the other sets, with fewer images
# per class (their class lists, styles and seeds unchanged): what a test reads is the set's classes
# and how many of the spec's images each split lists, whatever the count.
SMALL_COUNTS = {"SyntheticShapesV2": (0, 0, 2), "SyntheticShapesSketch": (0, 0, 1), "SyntheticPatterns": (1, 1, 1)}


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    return tmp_path_factory.mktemp("small_sets")


@pytest.fixture
def small_sets(small_root, monkeypatch):
    """The module's data root for the sets of SMALL_COUNTS, whose SETS entries hold those counts
    during the test (each set is rendered there by its first reader)."""
    for name, counts in SMALL_COUNTS.items():
        monkeypatch.setitem(SETS, name, dataclasses.replace(SETS[name], counts=counts))
    return small_root


def test_the_registered_sets_have_their_documented_sizes():
    assert SETS["SyntheticShapes"].counts == SETS["SyntheticPatterns"].counts == (24, 6, 25)
    assert SETS["SyntheticShapesV2"].counts == SETS["SyntheticShapesSketch"].counts == (0, 0, 15)
    assert [len(SETS[name].classes) for name in ("SyntheticShapes", "SyntheticPatterns", "SyntheticScenes")] == [80, 40, 10]


@pytest.mark.slow  # renders the full main set (shared with the end-to-end tests in the full suite)
def test_main_set_loads_through_the_registry_with_few_shot_and_subsampling(synthetic_data):
    base = DATASET_REGISTRY.get("SyntheticShapes")(cfg_for(synthetic_data, "SyntheticShapes", 16, "base"))
    assert base.classnames == [c.name for c in COLOR_SHAPE_CLASSES[:40]]
    assert (len(base.train_x), len(base.val), len(base.test)) == (16 * 40, 4 * 40, 25 * 40)
    assert os.path.isfile(synthetic_data / "synthetic_shapes" / "split_fewshot" / "shot_16-seed_1.json")
    new = DATASET_REGISTRY.get("SyntheticShapes")(cfg_for(synthetic_data, "SyntheticShapes", 16, "new"))
    assert new.classnames == [c.name for c in COLOR_SHAPE_CLASSES[40:]]
    assert new.test[0].label == 0 and new.test[0].classname == COLOR_SHAPE_CLASSES[40].name


def test_domain_generalisation_sets_are_test_only(small_sets):
    for name in ("SyntheticShapesV2", "SyntheticShapesSketch"):
        dataset = DATASET_REGISTRY.get(name)(cfg_for(small_sets, name))
        assert dataset.classnames == [c.name for c in COLOR_SHAPE_CLASSES]
        assert len(dataset.test) == SMALL_COUNTS[name][2] * 80 and not dataset.val
        assert [d.impath for d in dataset.train_x] == [d.impath for d in dataset.test]


def test_cross_dataset_set_has_its_own_vocabulary(small_sets):
    dataset = DATASET_REGISTRY.get("SyntheticPatterns")(cfg_for(small_sets, "SyntheticPatterns"))
    assert len(dataset.classnames) == 40 and "striped star" in dataset.classnames
    assert not set(dataset.classnames) & {c.name for c in COLOR_SHAPE_CLASSES}
    assert set(SETS) == {"SyntheticShapes", "SyntheticPatterns", "SyntheticShapesV2", "SyntheticShapesSketch",
                         "SyntheticScenes"}


def test_an_incomplete_set_names_the_fix(small_sets, tmp_path):
    folder = ensure_dataset(str(tmp_path), SETS["SyntheticShapesSketch"])
    os.remove(os.path.join(folder, "split_zhou_SyntheticShapesSketch.json"))
    with pytest.raises(DatasetLayoutError, match="Delete that folder"):
        DATASET_REGISTRY.get("SyntheticShapesSketch")(cfg_for(tmp_path, "SyntheticShapesSketch"))
