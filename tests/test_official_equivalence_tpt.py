"""TPT and CoCoOp+TPT against azshue/TPT (committed fixtures tpt.json, tpt-cocoop.json).

tools/official_equivalence.py ran one official test-time episode (tpt_classification.py's
select_confident_samples, avg_entropy and test_time_tuning on clip/custom_clip.py's
ClipTestTimeTuning, resp. clip/cocoop.py's CoCoOpCLIP and gen_ctx) on a seeded random CLIP
ViT-B/16, the context (and CoCoOp's meta-net) drawn away from its init and 64 seeded view tensors
of one image. Our PromptTuning episode, rebuilt from the same seeds, must keep the same views and
give the same loss, tuned context and test-view logits within 3e-3; a reversed context must fail.
"""
import pytest
import torch

from official_cases import build_case, load_fixture, oe, our_outputs


@pytest.fixture(scope="module", params=["tpt", "tpt-cocoop"])
def fixture(request):
    return load_fixture(request.param)


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    return build_case(fixture, official_weights)


@pytest.fixture(scope="module")
def ours(fixture, case):
    return our_outputs(fixture, case)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "azshue/TPT" and fixture["official_commit"].startswith("63ecbace")
    assert set(fixture["official_outputs"]) == {"kept", "loss", "ctx", "logits"}
    assert fixture["batch"] == 64 and len(fixture["official_outputs"]["kept"]) == 6  # 10 % of 64 views
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())


def test_same_views_kept_loss_step_and_prediction(fixture, ours):
    assert ours["kept"].tolist() == fixture["official_outputs"]["kept"]
    assert ours["logits"].shape == (len(fixture["classnames"]),) and ours["ctx"].shape == (4, 512)
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


def test_reversed_context_fails_the_comparison(fixture, case):
    learnables = dict(case[1], **{"prompt_learner.ctx": case[1]["prompt_learner.ctx"].flip(0)})
    misplaced = our_outputs(fixture, case, learnables)
    assert oe.relative_max_difference(misplaced["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE
    assert not torch.equal(misplaced["ctx"], torch.tensor(fixture["official_outputs"]["ctx"]))
