"""ProVP against the official code, MCG-NJU/ProVP (committed fixture provp.json).

tools/official_equivalence.py ran MCG-NJU/ProVP's ProVP/trainers/provp.py (``mProVP``, the
zero-shot ``CLIP`` and ``ReformatLoss`` of its fp32 branch; commit in the fixture) on a seeded
random CLIP ViT-B/16, the prompts P [12, 16, 768] drawn at 10x their init std and a seeded batch
of 2 images and 3 classes. Our ProVPCLIP, rebuilt from the same seeds, must give the same logits,
CE, re-formation term, total loss and per-token gradient norms of P within 3e-3; prompts of the
wrong layers, and the re-mix weights α and 1 − α swapped, must fail; without the
re-formation term the loss must differ from the official one.
"""
import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

PROMPTS = "prompt_learner.prompt_embeddings"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("provp")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    return build_case(fixture, official_weights)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "MCG-NJU/ProVP"
    assert fixture["official_commit"].startswith("837b8fb3") and fixture["dassl_commit"] == fixture["official_commit"]
    assert fixture["parameter_mapping"] == {PROMPTS: PROMPTS}
    assert set(fixture["official_outputs"]) == {"logits", "xe_loss", "ref_loss", "loss", "prompt_grad_norms"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    official = fixture["official_outputs"]
    assert official["loss"] == pytest.approx(official["xe_loss"] + official["ref_loss"], rel=1e-6)  # λ = 1


def test_matches_official_outputs(fixture, case):
    ours = our_outputs(fixture, case)
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    assert ours["prompt_grad_norms"].shape == (12, 16)
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("misplacement", ["layers reversed", "layers 1 and 2 swapped"])
def test_prompts_of_the_wrong_layers_fail_the_comparison(fixture, case, misplacement):
    prompts = case[1][PROMPTS]
    if misplacement == "layers reversed":
        moved = prompts.flip(0)
    else:
        moved = prompts.clone()
        moved[[1, 2]] = prompts[[2, 1]]
    ours = our_outputs(fixture, case, {PROMPTS: moved})
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_swapped_re_mix_weights_fail_the_comparison(fixture, case):
    """α = 0.99 (the weights of x_p and P_l swapped) keeps the previous outputs instead of P_l. (A plain
    replacement, α = 0, differs from α = 0.01 by less than the tolerance: 1 % of the prompt outputs.)"""
    ours = our_outputs(fixture, case, node_changes={"ALPHA": 0.99})
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_the_official_loss_includes_the_re_formation_term(fixture, case):
    ours = our_outputs(fixture, case, node_changes={"REF_WEIGHT": 0.0})
    assert oe.relative_max_difference(ours["loss"], fixture["official_outputs"]["loss"]) > oe.TOLERANCE
