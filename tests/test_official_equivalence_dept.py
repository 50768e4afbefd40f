"""DePT on MaPLe and on CoOp against the official Koorye/DePT code (committed fixtures
dept-maple.json and dept-coop.json).

tools/official_equivalence.py ran the official trainers/elp_maple.py and elp_coop.py CustomCLIP
(commit in the fixture) on a seeded random CLIP ViT-B/16 with every learnable value drawn away
from its init (the base method's prompts: MaPLe's T_1, deep text prompts and couplings F_1..F_9,
or CoOp's 16 shared context vectors; DePT's FiLM γ/β of both towers and the linear head), a
seeded batch of 2 images and 3 classes. Our DePTCLIP on MaPLeCLIP or CoOpCLIP, rebuilt from the
same seeds with the fixture's explicit parameter-name mapping, must give the same similarity
logits, head logits, fused base-role logits and training loss (0.3·CE + 0.7·CE_head over
[text_y; image]) within the contract's relative max difference (3e-3); values put in the wrong
place (context tokens in reverse order, FiLM of the other tower) must fail.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import official_equivalence as oe  # noqa: E402  (tools/official_equivalence.py)

METHODS = ("DePT-MaPLe", "DePT-CoOp")
# The number of mapped learnables: the base's prompts, FiLM γ/β ×2, head weight and bias.
BASE_LEARNABLES = {"DePT-MaPLe": 1 + 2 * 9 + 8, "DePT-CoOp": 1}  # MaPLe: T_1, F_1..F_9, T_2..T_9; CoOp: ctx


def _fixture(method):
    with open(os.path.join(oe.FIXTURE_DIR, f"{method.lower()}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def cases(official_weights):
    """{method: (fixture, weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])}."""
    found = {}
    for method in METHODS:
        fixture = _fixture(method)
        path, resolution, width = official_weights(fixture["backbone"], fixture["seeds"]["weights"])
        learnables, images, labels = oe.make_inputs(method, resolution, width, fixture["seeds"], fixture["batch"],
                                                    len(fixture["classnames"]))
        assert labels.tolist() == fixture["labels"]
        found[method] = (fixture, path, learnables, images, labels)
    return found


def _ours(case, learnables=None):
    fixture, path, default, images, labels = case
    return oe.our_outputs(fixture["method"], fixture["backbone"], path, fixture["classnames"],
                          learnables or default, images, labels)


@pytest.fixture(scope="module")
def outputs(cases):
    return {method: _ours(case) for method, case in cases.items()}


@pytest.mark.parametrize("method", METHODS)
def test_fixture_records_the_official_run(method):
    fixture = _fixture(method)
    assert fixture["official_repository"] == "Koorye/DePT"
    assert len(fixture["official_commit"]) == 40
    assert set(fixture["official_outputs"]) == {"logits", "head_logits", "fused_logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[method]["learnables"].items()}
    assert mapping["film_image.shift"] == "film_lp_img.bias"
    assert mapping["head.weight"] == "linear_probe_proj.weight"
    assert mapping["base.prompt_learner.ctx"] == "prompt_learner.ctx"
    assert len(mapping) == BASE_LEARNABLES[method] + 4 + 2


def test_maple_fixture_maps_the_deep_couplings():
    mapping = _fixture("DePT-MaPLe")["parameter_mapping"]
    assert mapping["base.prompt_learner.compound_prompt_projections.7.bias"] == \
        "prompt_learner.compound_prompt_projections.7.bias"


def test_coop_fixture_runs_coop_with_sixteen_shared_random_context_vectors():
    fixture = _fixture("DePT-CoOp")
    assert fixture["official_cfg"]["TRAINER.COOP"] == fixture["our_node"]
    assert (fixture["our_node"]["N_CTX"], fixture["our_node"]["CSC"], fixture["our_node"]["CTX_INIT"]) == (16, False, "")


@pytest.mark.parametrize("method", METHODS)
def test_every_learnable_value_is_set_away_from_its_init(method, cases):
    learnables = cases[method][2]
    for name in ("film_image.scale", "film_text.scale"):
        assert (learnables[name] - 1.0).abs().max() > 0.05, name
    for name in ("film_image.shift", "film_text.shift", "head.bias", "base.prompt_learner.ctx"):
        assert learnables[name].abs().max() > 0.05, name


@pytest.mark.parametrize("method", METHODS)
def test_matches_official_outputs(method, cases, outputs):
    fixture, ours = cases[method][0], outputs[method]
    assert ours["fused_logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("method", METHODS)
def test_fused_logits_are_the_weighted_sum_of_logits(method, outputs):
    fused = 0.3 * outputs[method]["logits"] + 0.7 * outputs[method]["head_logits"]
    assert oe.relative_max_difference(outputs[method]["fused_logits"], fused) < 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_misplaced_prompt_token_fails_the_comparison(method, cases):
    fixture, learnables = cases[method][0], cases[method][2]
    flipped = dict(learnables, **{"base.prompt_learner.ctx": learnables["base.prompt_learner.ctx"].flip(0)})
    ours = _ours(cases[method], flipped)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


@pytest.mark.parametrize("method", METHODS)
def test_film_of_the_wrong_tower_fails_the_comparison(method, cases):
    """γ/β of the image tower put on the text tower and vice versa: the head sees other features."""
    fixture, learnables = cases[method][0], dict(cases[method][2])
    for kind in ("scale", "shift"):
        learnables[f"film_image.{kind}"], learnables[f"film_text.{kind}"] = \
            cases[method][2][f"film_text.{kind}"], cases[method][2][f"film_image.{kind}"]
    ours = _ours(cases[method], learnables)
    for key in ("head_logits", "loss"):
        assert oe.relative_max_difference(ours[key], fixture["official_outputs"][key]) > oe.TOLERANCE, key
