"""MMRL and MMRL++ against the official yunncheng/MMRL code (committed fixtures mmrl.json, mmrlpp.json).

tools/official_equivalence.py ran the official trainers/mmrl.py and trainers/mmrlpp.py CustomCLIP
(commit in the fixture) on a seeded random CLIP ViT-B/16 with every learnable value drawn away
from its init (R; MMRL's 7 per-layer maps of both towers, each drawn on its own, and proj_rep;
MMRL++'s shared weights, per-layer biases and low-rank residuals A, B, and the projection
residual A_p, B_p), a seeded batch of 2 images and 3 classes, OxfordPets' template. Our
MMRLCLIP / MMRLppCLIP, rebuilt from the same seeds with the fixture's explicit parameter-name
mapping, must give the same fused base-role logits, class-token logits, representation logits
and training loss (with the λ regularisers against the frozen CLIP) within the contract's
relative max difference (3e-3); tokens or values put in the wrong place must fail.
"""
import pytest
import torch

from official_cases import build_case, load_fixture, oe, our_outputs

METHODS = ("MMRL", "MMRLpp")
LAYERS = list(range(6, 13))


def _fixture(method):
    return load_fixture(method.lower())


@pytest.fixture(scope="module")
def cases(official_weights):
    """{method: (weights file, learnable values {our name: tensor}, images, labels)}."""
    return {method: build_case(_fixture(method), official_weights) for method in METHODS}


def _ours(method, cases, learnables=None, node_changes=None):
    return our_outputs(_fixture(method), cases[method], learnables, node_changes)


@pytest.fixture(scope="module")
def outputs(cases):
    return {method: _ours(method, cases) for method in METHODS}


def _fails(ours, fixture, keys=("logits", "cls_logits", "rep_logits", "loss")):
    return {key: oe.relative_max_difference(ours[key], fixture["official_outputs"][key]) > oe.TOLERANCE
            for key in keys}


@pytest.mark.parametrize("method, n_mapped", [("MMRL", 2 + 2 * 7 * 2), ("MMRLpp", 3 + 2 * (1 + 7 * 3))])
def test_fixture_records_the_official_run(method, n_mapped):
    fixture = _fixture(method)
    assert fixture["official_repository"] == "yunncheng/MMRL" and len(fixture["official_commit"]) == 40
    assert set(fixture["official_outputs"]) == {"logits", "cls_logits", "rep_logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[method]["learnables"].items()}
    assert len(mapping) == n_mapped
    assert mapping["representation.rep"] == "representation_learner.compound_rep_tokens"


def test_parameter_names_map_layer_by_layer():
    mmrl, mmrlpp = (_fixture(method)["parameter_mapping"] for method in METHODS)
    assert mmrl["representation.visual.6.bias"] == "representation_learner.compound_rep_tokens_r2vproj.6.bias"
    assert mmrl["representation.text.3.weight"] == "representation_learner.compound_rep_tokens_r2tproj.3.weight"
    assert mmrl["representation.proj_rep"] == "image_encoder.proj_rep"
    assert mmrlpp["representation.visual.residuals.4.a"] == "representation_learner.srra_r2vproj.srra.4.A"
    assert mmrlpp["representation.text.bias.2"] == "representation_learner.srra_r2tproj.srra.2.bias"
    assert mmrlpp["representation.proj_residual.b"] == "image_encoder.B"


def test_every_learnable_value_is_drawn_on_its_own(cases):
    learnables = cases["MMRL"][1]
    for tower in ("visual", "text"):
        weights = [learnables[f"representation.{tower}.{i}.weight"] for i in range(7)]
        assert all(not torch.equal(weights[0], other) for other in weights[1:])  # upstream's copies start equal
    learnables = cases["MMRLpp"][1]
    for tower in ("visual", "text"):
        for i in range(7):
            assert learnables[f"representation.{tower}.residuals.{i}.b"].abs().max() > 0.05  # zero at init
    assert learnables["representation.proj_residual.b"].abs().max() > 0.05


@pytest.mark.parametrize("method", METHODS)
def test_matches_official_outputs(method, cases, outputs):
    fixture, ours = _fixture(method), outputs[method]
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("method", METHODS)
def test_fused_logits_are_the_weighted_sum(method, outputs):
    ours = outputs[method]
    fused = 0.7 * ours["cls_logits"] + 0.3 * ours["rep_logits"]
    assert oe.relative_max_difference(ours["logits"], fused) < 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_representation_tokens_one_block_early_fail_the_comparison(method, cases):
    ours = _ours(method, cases, node_changes={"REP_LAYERS": [layer - 1 for layer in LAYERS]})
    assert all(_fails(ours, _fixture(method)).values())


def test_mmrl_projector_copies_swapped_fail_the_comparison(cases):
    """P_v and P_t of layers 6 and 7 exchanged: every copy holds other values, so the order matters."""
    learnables = dict(cases["MMRL"][1])
    for tower in ("visual", "text"):
        for kind in ("weight", "bias"):
            first, second = f"representation.{tower}.0.{kind}", f"representation.{tower}.1.{kind}"
            learnables[first], learnables[second] = learnables[second], learnables[first]
    assert all(_fails(_ours("MMRL", cases, learnables), _fixture("MMRL")).values())


def test_mmrlpp_swapped_blend_weights_fail_the_comparison(cases):
    """β and 1 − β exchanged (0.3 instead of OxfordPets' 0.7) in both towers."""
    ours = _ours("MMRLpp", cases, node_changes={"BETA": 0.3})
    assert all(_fails(ours, _fixture("MMRLpp")).values())


def test_mmrlpp_residuals_of_two_layers_swapped_fail_the_comparison(cases):
    learnables = dict(cases["MMRLpp"][1])
    for tower in ("visual", "text"):
        for kind in ("a", "b"):
            first, second = f"representation.{tower}.residuals.0.{kind}", f"representation.{tower}.residuals.1.{kind}"
            learnables[first], learnables[second] = learnables[second], learnables[first]
    assert all(_fails(_ours("MMRLpp", cases, learnables), _fixture("MMRLpp")).values())
