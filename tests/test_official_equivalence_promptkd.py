"""PromptKD against the official zhengli97/PromptKD code (committed fixture promptkd.json).

tools/official_equivalence.py ran the official trainers/promptkd.py (commit in the fixture): its
student CustomCLIP on a seeded random CLIP ViT-B/16 and its teacher CustomCLIP_teacher on a seeded
random CLIP with ViT-L/14's embedding width (tools/official_methods/promptkd.py), the student's
vision prompts and projector and the teacher's PromptSRC prompts all drawn away from their inits,
a seeded batch of 2 images and 3 classes; the official ``test`` gave the base logits (first 2
classes) and the new logits (the third), its teacher the teacher logits over the 3 classes,
``forward_backward`` the distillation loss. Our
PromptKDCLIP with a PromptSRCTeacher, rebuilt from the same seeds with the fixture's mapping, must
agree within 3e-3; prompts or projector layers put in the wrong place must fail.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

METHOD = "PromptKD"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("promptkd")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    return build_case(fixture, official_weights)


def _differences(fixture, ours):
    return {key: oe.relative_max_difference(ours[key], official)
            for key, official in fixture["official_outputs"].items()}


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "zhengli97/PromptKD"
    assert fixture["official_commit"].startswith("ec244f78")
    assert set(fixture["official_outputs"]) == {"base_logits", "new_logits", "teacher_logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[METHOD]["learnables"].items()}
    assert mapping["student.projector.0.weight"] == "student.VPT_image_trans.conv1.0.weight"
    assert len(mapping) == 9 + 6 + 1 + 8 + 9  # student V_1..V_9, projector, teacher T_1..T_9, V_1..V_9


def test_matches_official_outputs(fixture, case):
    ours = our_outputs(fixture, case)
    assert ours["base_logits"].shape == (fixture["batch"], 2) and ours["new_logits"].shape == (fixture["batch"], 1)
    for key, difference in _differences(fixture, ours).items():
        assert difference <= oe.TOLERANCE, key


def _swapped(case, first, second):
    learnables = dict(case[1])
    learnables[first], learnables[second] = case[1][second], case[1][first]
    return learnables


@pytest.mark.parametrize("first, second", [
    ("student.vision_prompts.1", "student.vision_prompts.2"),  # the student's prompts of layers 2 and 3
    ("student.projector.0.bias", "student.projector.3.bias"),  # the projector's two layers
    ("teacher.model.text_prompts.0", "teacher.model.text_prompts.1"),  # the teacher's text prompts, layers 2 and 3
])
def test_misplaced_values_fail_the_comparison(fixture, case, first, second):
    ours = our_outputs(fixture, case, _swapped(case, first, second))
    assert max(_differences(fixture, ours).values()) > oe.TOLERANCE


def test_misplaced_teacher_vision_prompts_move_the_teacher_logits(fixture, case):
    """Four prompt tokens among 197 move the random teacher's class token little: swapping its
    vision prompts of layers 1 and 2 changes its logits by about 3e-4, below the contract's 3e-3
    but 100x above the agreement with the official code (about 6e-7)."""
    recorded = fixture["relative_max_difference"]["teacher_logits"]
    swapped = _swapped(case, "teacher.model.vision_prompts.0", "teacher.model.vision_prompts.1")
    ours = our_outputs(fixture, case, swapped)
    assert recorded < 1e-5 and _differences(fixture, ours)["teacher_logits"] > 1e-4
