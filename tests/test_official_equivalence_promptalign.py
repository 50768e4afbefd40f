"""PromptAlign against jameelhassan/PromptAlign (committed fixture promptalign.json).

tools/official_equivalence.py ran the official trainers/prompt_align.py (its CustomCLIP, and its
PromptAlign.test_time_tuning with avg_entropy, select_confident_samples and distr_align_loss; commit
in the fixture) on a seeded random CLIP ViT-B/16 with MaPLe's prompts (depth 3: T_1..T_3, F_1..F_3)
drawn away from their inits, 3 classes and 12 seeded images: 4 stand for the source training set
(the source token statistics), 8 are one test image's views (2 kept). Our side, rebuilt from the
same seeds, must give the same source statistics, kept views' statistics, alignment and total loss,
prompts after the AdamW step and logits of the test view within 3e-3; aligning other blocks or
swapping the deep prompts must fail.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

METHOD = "PromptAlign"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("promptalign")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [12, 3, R, R], labels [12])."""
    return build_case(fixture, official_weights)


@pytest.fixture(scope="module")
def ours(fixture, case):
    return our_outputs(fixture, case)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "jameelhassan/PromptAlign"
    assert len(fixture["official_commit"]) == 40
    assert set(fixture["official_outputs"]) == set(oe.METHODS[METHOD]["outputs"])
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    assert fixture["batch"] == 4 + 8 and fixture["our_node"]["ALIGN_LAYERS"] == [0, 1]
    assert len(fixture["parameter_mapping"]) == 1 + 2 * 3 + 2  # T_1, F_1..F_3 (weight, bias), T_2, T_3


def test_matches_official_outputs(fixture, ours):
    assert ours["logits"].shape == (1, len(fixture["classnames"]))
    assert ours["source_means"].shape == (2, 1 + 196 + 2, 4)  # blocks 0, 1; CLS, patches, prompts; 4 channels
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


def test_aligning_other_blocks_fails_the_comparison(fixture, case):
    changed = our_outputs(fixture, case, node_changes={"ALIGN_LAYERS": [0, 2]})
    assert oe.relative_max_difference(changed["alignment"], fixture["official_outputs"]["alignment"]) > oe.TOLERANCE


def test_swapped_deep_prompts_fail_the_comparison(fixture, case):
    learnables = dict(case[1])
    first, second = "prompt_learner.compound_prompts_text.0", "prompt_learner.compound_prompts_text.1"
    learnables[first], learnables[second] = case[1][second], case[1][first]
    changed = our_outputs(fixture, case, learnables)
    assert any(oe.relative_max_difference(changed[key], fixture["official_outputs"][key]) > oe.TOLERANCE
               for key in ("view_means", "alignment", "logits"))
