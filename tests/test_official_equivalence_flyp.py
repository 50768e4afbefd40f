"""FLYP against the official locuslab/FLYP code (committed fixture flyp.json).

tools/official_equivalence.py ran the official code (commit in the fixture; no Dassl) on a seeded
random CLIP ViT-B/16 whose logit scale is drawn away from log(100): its clip.load, CLIP.forward and
ClipLoss on 2 (image, caption) rows (both images of class 0, captions from the ImageNet templates
3 and 41, tokenised as its CsvDataset does), and the evaluation logits after its
get_zeroshot_classifier rebuilt the 80-template head over 3 classes. Our FLYPCLIP rebuilt from the
same seeds must give the same loss and logits within the contract's relative max difference
(3e-3); swapped row templates, one template instead of 80, or a fixed temperature must fail.
"""
import math

import pytest
import torch

from official_cases import build_case, load_fixture, oe, our_outputs


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("flyp")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, {"clip.logit_scale": value}, images [2, 3, 224, 224], labels [0, 0])."""
    case = build_case(fixture, official_weights)
    assert case[3].tolist() == [0, 0] and set(case[1]) == {"clip.logit_scale"}
    return case


@pytest.fixture(scope="module")
def ours(fixture, case):
    return our_outputs(fixture, case)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "locuslab/FLYP"
    assert fixture["official_commit"].startswith("215d5bb6")
    assert set(fixture["official_outputs"]) == {"loss", "logits"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    assert fixture["parameter_mapping"] == {"clip.logit_scale": "logit_scale"}
    assert fixture["our_node"]["ROW_TEMPLATES"] == [3, 41]


def test_matches_official_outputs(fixture, ours):
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


def test_swapped_row_templates_fail_the_loss_comparison(fixture, case, ours):
    swapped = our_outputs(fixture, case, node_changes={"ROW_TEMPLATES": [41, 3]})
    assert oe.relative_max_difference(swapped["loss"], fixture["official_outputs"]["loss"]) > oe.TOLERANCE
    torch.testing.assert_close(swapped["logits"], ours["logits"])


def test_one_template_head_fails_the_logits_comparison(fixture, case):
    single = our_outputs(fixture, case, node_changes={"TEMPLATE_ENSEMBLE": False, "TEMPLATE": "a photo of a {}.",
                                                      "ROW_TEMPLATES": [0, 0]})
    assert oe.relative_max_difference(single["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_a_fixed_temperature_of_100_fails_the_comparison(fixture, case):
    learnables = {"clip.logit_scale": torch.tensor(math.log(100.0))}
    fixed = our_outputs(fixture, case, learnables=learnables)
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(fixed[key], official) > oe.TOLERANCE, key
