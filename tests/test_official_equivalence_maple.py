"""MaPLe against the official MaPLe code in Koorye/DePT (committed fixture maple.json).

tools/official_equivalence.py ran Koorye/DePT's trainers/maple.py CustomCLIP (the MaPLe code
DePT builds on; commit in the fixture) on a seeded random CLIP ViT-B/16 with T_1, the deep text
prompts T_2..T_9 and the couplings F_1..F_9 all drawn away from their inits, and a seeded batch
of 2 images and 3 classes. Our MaPLeCLIP, rebuilt from the same seeds with the fixture's
parameter-name mapping, must give the same logits and cross-entropy within 3e-3; prompts or
couplings put in the wrong place must fail.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

METHOD = "MaPLe"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("maple")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    return build_case(fixture, official_weights)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "Koorye/DePT"
    assert len(fixture["official_commit"]) == 40
    assert set(fixture["official_outputs"]) == {"logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[METHOD]["learnables"].items()}
    assert mapping["prompt_learner.proj.weight"] == "prompt_learner.proj.weight"
    assert len(mapping) == 1 + 2 * 9 + 8  # T_1, F_1..F_9 (weight, bias), T_2..T_9


def test_matches_official_outputs(fixture, case):
    ours = our_outputs(fixture, case)
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("misplacement", ["ctx tokens reversed", "deep prompts of layers 2 and 3 swapped",
                                          "couplings F_2 and F_3 swapped"])
def test_misplaced_prompt_fails_the_comparison(fixture, case, misplacement):
    learnables = dict(case[1])
    if misplacement == "ctx tokens reversed":
        learnables["prompt_learner.ctx"] = learnables["prompt_learner.ctx"].flip(0)
    elif misplacement == "deep prompts of layers 2 and 3 swapped":
        first, second = "prompt_learner.compound_prompts_text.0", "prompt_learner.compound_prompts_text.1"
        learnables[first], learnables[second] = case[1][second], case[1][first]
    else:
        for kind in ("weight", "bias"):
            first = f"prompt_learner.compound_prompt_projections.0.{kind}"
            second = f"prompt_learner.compound_prompt_projections.1.{kind}"
            learnables[first], learnables[second] = case[1][second], case[1][first]
    ours = our_outputs(fixture, case, learnables)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE
