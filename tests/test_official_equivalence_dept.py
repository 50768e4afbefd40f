"""DePT on MaPLe against the official Koorye/DePT code (committed fixture dept-maple.json).

tools/official_equivalence.py ran the official trainers/elp_maple.py CustomCLIP (commit in the
fixture) on a seeded random CLIP ViT-B/16 with every learnable value drawn away from its init
(MaPLe's T_1, deep text prompts and couplings F_1..F_9, DePT's FiLM γ/β of both towers and the
linear head), a seeded batch of 2 images and 3 classes. Our DePTCLIP on MaPLeCLIP, rebuilt from
the same seeds with the fixture's explicit parameter-name mapping, must give the same similarity
logits, head logits, fused base-role logits and training loss (0.3·CE + 0.7·CE_head over
[text_y; image]) within the contract's relative max difference (3e-3); values put in the wrong
place must fail.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

METHOD = "DePT-MaPLe"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("dept-maple")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    return build_case(fixture, official_weights)


@pytest.fixture(scope="module")
def outputs(fixture, case):
    return our_outputs(fixture, case)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "Koorye/DePT"
    assert len(fixture["official_commit"]) == 40
    assert set(fixture["official_outputs"]) == {"logits", "head_logits", "fused_logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[METHOD]["learnables"].items()}
    assert mapping["film_image.shift"] == "film_lp_img.bias"
    assert mapping["head.weight"] == "linear_probe_proj.weight"
    assert mapping["base.prompt_learner.compound_prompt_projections.7.bias"] == \
        "prompt_learner.compound_prompt_projections.7.bias"
    assert len(mapping) == 1 + 2 * 9 + 8 + 4 + 2  # T_1, F_1..F_9, T_2..T_9, FiLM γ/β ×2, head


def test_every_learnable_value_is_set_away_from_its_init(case):
    _, learnables, _, _ = case
    for name in ("film_image.scale", "film_text.scale"):
        assert (learnables[name] - 1.0).abs().max() > 0.05, name
    for name in ("film_image.shift", "film_text.shift", "head.bias", "base.prompt_learner.ctx"):
        assert learnables[name].abs().max() > 0.05, name


def test_matches_official_outputs(fixture, outputs):
    assert outputs["fused_logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(outputs[key], official) <= oe.TOLERANCE, key


def test_fused_logits_are_the_weighted_sum_of_logits(outputs):
    fused = 0.3 * outputs["logits"] + 0.7 * outputs["head_logits"]
    assert oe.relative_max_difference(outputs["fused_logits"], fused) < 1e-6


def test_misplaced_prompt_token_fails_the_comparison(fixture, case):
    learnables = dict(case[1], **{"base.prompt_learner.ctx": case[1]["base.prompt_learner.ctx"].flip(0)})
    ours = our_outputs(fixture, case, learnables)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_film_of_the_wrong_tower_fails_the_comparison(fixture, case):
    """γ/β of the image tower put on the text tower and vice versa: the head sees other features."""
    learnables = dict(case[1])
    for kind in ("scale", "shift"):
        learnables[f"film_image.{kind}"], learnables[f"film_text.{kind}"] = \
            case[1][f"film_text.{kind}"], case[1][f"film_image.{kind}"]
    ours = our_outputs(fixture, case, learnables)
    for key in ("head_logits", "loss"):
        assert oe.relative_max_difference(ours[key], fixture["official_outputs"][key]) > oe.TOLERANCE, key
