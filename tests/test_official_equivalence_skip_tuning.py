"""Skip Tuning against the official Koorye/SkipTuning code (committed fixture skiptuning.json).

tools/official_equivalence.py ran the official trainers/skip_tuning.py SkipCustomCLIP (commit in
the fixture) on a seeded random CLIP ViT-B/16 (the weights Skip Tuning tunes; no value is added),
a seeded batch of 2 images labelled [0, 0] and 3 classes: its inference logits, and its training
loss from the images' block-5 states with the class-wise skip under the keep mask [1, 1, 0] (the
batch's class, then the class of higher prototype similarity). Our SkipTuningCLIP rebuilt from
the same seeds must give the same logits and loss within the contract's relative max difference
(3e-3); another mask, or another template, must fail.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import official_equivalence as oe  # noqa: E402  (tools/official_equivalence.py)

METHOD = "SkipTuning"


@pytest.fixture(scope="module")
def fixture():
    with open(os.path.join(oe.FIXTURE_DIR, "skiptuning.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {} (none), images [B, 3, R, R], labels [B])."""
    path, resolution, width = official_weights(fixture["backbone"], fixture["seeds"]["weights"])
    learnables, images, labels = oe.make_inputs(METHOD, resolution, width, fixture["seeds"], fixture["batch"],
                                                len(fixture["classnames"]))
    assert labels.tolist() == fixture["labels"] == [0, 0] and learnables == {}
    return path, images, labels


def _ours(fixture, case, **node_changes):
    path, images, labels = case
    return oe.our_outputs(METHOD, fixture["backbone"], path, fixture["classnames"], {}, images, labels,
                          node_changes=node_changes)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "Koorye/SkipTuning"
    assert fixture["official_commit"].startswith("8c4636ed")
    assert set(fixture["official_outputs"]) == {"logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    assert fixture["parameter_mapping"] == {} and fixture["our_node"]["KEEP_MASK"] == [True, True, False]


def test_matches_official_outputs(fixture, case):
    outputs = _ours(fixture, case)
    assert outputs["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(outputs[key], official) <= oe.TOLERANCE, key


def test_another_keep_mask_fails_the_loss_comparison(fixture, case):
    ours = _ours(fixture, case, KEEP_MASK=[True, False, True])  # the class of lower prototype similarity
    assert oe.relative_max_difference(ours["loss"], fixture["official_outputs"]["loss"]) > oe.TOLERANCE
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) <= oe.TOLERANCE


def test_the_datasets_own_template_fails_the_comparison(fixture, case, monkeypatch):
    from trainers import skip_tuning

    monkeypatch.setitem(skip_tuning.TEMPLATES, "OxfordPets", "a photo of a {}, a type of pet.")  # the CoOp one
    ours = _ours(fixture, case)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE
