"""Skip Tuning against the official Koorye/SkipTuning code (committed fixture skiptuning.json).

tools/official_equivalence.py ran the official trainers/skip_tuning.py SkipCustomCLIP (commit in
the fixture) on a seeded random CLIP ViT-B/16 (the weights Skip Tuning tunes; no value is added),
a seeded batch of 2 images labelled [0, 0] and 3 classes: its inference logits, and its training
loss from the images' block-5 states with the class-wise skip under the keep mask [1, 1, 0] (the
batch's class, then the class of higher prototype similarity). Our SkipTuningCLIP rebuilt from
the same seeds must give the same logits and loss within the contract's relative max difference
(3e-3); another mask, or another template, must fail.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("skiptuning")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {} (none), images [B, 3, R, R], labels [B])."""
    case = build_case(fixture, official_weights)
    assert case[3].tolist() == [0, 0] and case[1] == {}
    return case


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "Koorye/SkipTuning"
    assert fixture["official_commit"].startswith("8c4636ed")
    assert set(fixture["official_outputs"]) == {"logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    assert fixture["parameter_mapping"] == {} and fixture["our_node"]["KEEP_MASK"] == [True, True, False]


def test_matches_official_outputs(fixture, case):
    outputs = our_outputs(fixture, case)
    assert outputs["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(outputs[key], official) <= oe.TOLERANCE, key


def test_another_keep_mask_fails_the_loss_comparison(fixture, case):
    # the class of lower prototype similarity
    ours = our_outputs(fixture, case, node_changes={"KEEP_MASK": [True, False, True]})
    assert oe.relative_max_difference(ours["loss"], fixture["official_outputs"]["loss"]) > oe.TOLERANCE
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) <= oe.TOLERANCE


def test_the_datasets_own_template_fails_the_comparison(fixture, case, monkeypatch):
    from trainers import skip_tuning

    monkeypatch.setitem(skip_tuning.TEMPLATES, "OxfordPets", "a photo of a {}, a type of pet.")  # the CoOp one
    ours = our_outputs(fixture, case)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE
