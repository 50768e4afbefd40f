"""Our trainers' models against the outputs of their official code (committed fixtures).

Each fixture in tests/fixtures/official/ was written by tools/official_equivalence.py, which ran
the official repository (commit in the fixture) on a seeded random CLIP ViT-B/16, seeded
learnable values (10x the official init std) and a seeded batch of 2 images and 3 classes.
Here our side is rebuilt from the same seeds and must give the same outputs within the
contract's relative max difference (3e-3): CoOp's logits and cross-entropy; ProGrad's student
and zero-shot logits, CE, KL and the projected ctx gradient (one official update step); TCP's
logits and its loss CE + 8·(1 − mean cos); MMA's logits and CE. Learnable values with their
rows in the wrong order, TCP's class-aware tokens injected one text block off and MMA's
adapters one block early must fail the comparison.
"""
import re

import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

METHODS = ("CoOp", "ProGrad", "TCP", "MMA")


def _fixture(method):
    return load_fixture(method.lower())


def _case(method, official_weights):
    """(fixture, case of ``build_case``) of a method."""
    fixture = _fixture(method)
    return fixture, build_case(fixture, official_weights)


@pytest.fixture(scope="module")
def outputs(official_weights):
    """{method: our outputs on the fixture's inputs}."""
    return {method: our_outputs(*_case(method, official_weights)) for method in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_fixture_records_the_official_run(method):
    fixture = _fixture(method)
    assert fixture["official_repository"] == oe.METHODS[method]["repository"]
    assert len(fixture["official_commit"]) == 40
    assert fixture["parameter_mapping"] == {name: entry["official"]
                                            for name, entry in oe.METHODS[method]["learnables"].items()}
    assert set(fixture["official_outputs"]) == set(oe.METHODS[method]["outputs"])
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())


@pytest.mark.parametrize("method", METHODS)
def test_matches_official_outputs(method, outputs):
    fixture, ours = _fixture(method), outputs[method]
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("method", METHODS)
def test_learnable_rows_in_wrong_order_fail_the_comparison(method, official_weights):
    fixture, case = _case(method, official_weights)
    swapped = {name: value.flip(0) for name, value in case[1].items()}  # e.g. ctx tokens in reverse order
    ours = our_outputs(fixture, case, swapped)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


@pytest.mark.parametrize("layer", [7, 9])
def test_tcp_injection_one_block_off_fails_the_comparison(layer, official_weights):
    fixture, case = _case("TCP", official_weights)
    assert fixture["our_node"]["INJECT_LAYER"] == 8
    ours = our_outputs(fixture, case, node_changes={"INJECT_LAYER": layer})
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_mma_adapters_one_block_early_fail_the_comparison(official_weights):
    """The same adapter values at blocks 4..11 instead of 5..12 (both towers) move the logits."""
    fixture, case = _case("MMA", official_weights)
    assert (fixture["our_node"]["ADAPTER_START"], fixture["our_node"]["ADAPTER_END"]) == (5, 12)
    moved = {re.sub(r"\.(\d+)\.", lambda m: f".{int(m.group(1)) - 1}.", name, count=1): value
             for name, value in case[1].items()}
    ours = our_outputs(fixture, case, moved, {"ADAPTER_START": 4, "ADAPTER_END": 11})
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_prograd_batch_exercises_the_projection(outputs):
    """The fixture's batch has conflicting CE and KL gradients, so the compared update is not the CE gradient."""
    fixture, ours = _fixture("ProGrad"), outputs["ProGrad"]
    assert oe.relative_max_difference(ours["ctx_grad_ce"], fixture["official_outputs"]["ctx_update"]) > 0.1


def test_relative_max_difference_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="Shapes differ"):
        oe.relative_max_difference([[1.0, 2.0]], [[1.0], [2.0]])


def test_tool_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        oe.main(["Foo"])
    assert "unknown method 'Foo'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        oe.main(["CoOp", "--official-git", str(tmp_path)])
    assert "CoOp needs --official-git and --dassl-git" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="is not a git repository"):
        oe.main(["ProGrad", "--official-git", str(tmp_path)])
