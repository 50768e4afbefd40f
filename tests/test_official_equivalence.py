"""Our trainers' models against the logits and loss of their official code (committed fixtures).

Each fixture in tests/fixtures/official/ was written by tools/official_equivalence.py, which ran
the official repository (commit in the fixture) on a seeded random CLIP ViT-B/16, seeded
learnable values (10x the official init std) and a seeded batch. Here our side is rebuilt from
the same seeds and must give the same logits [B, C] and cross-entropy within the contract's
relative max difference (3e-3); a context with its tokens in the wrong order must not.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import official_equivalence as oe  # noqa: E402  (tools/official_equivalence.py)


def _fixture(method):
    with open(os.path.join(oe.FIXTURE_DIR, f"{method.lower()}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def coop_case(tmp_path_factory):
    fixture = _fixture("CoOp")
    weights_path, learnables, images, labels = oe.fixture_inputs(fixture, str(tmp_path_factory.mktemp("coop")))
    return fixture, weights_path, learnables, images, labels


def _ours(fixture, weights_path, learnables, images, labels):
    return oe.our_logits(fixture["method"], fixture["backbone"], weights_path, fixture["classnames"],
                         learnables, images, labels)


def test_coop_fixture_records_the_official_run():
    fixture = _fixture("CoOp")
    assert fixture["official_repository"] == "KaiyangZhou/CoOp"
    assert len(fixture["official_commit"]) == 40
    assert fixture["parameter_mapping"] == {"prompt_learner.ctx": "prompt_learner.ctx"}
    assert fixture["relative_max_difference"]["logits"] <= oe.TOLERANCE
    assert fixture["relative_max_difference"]["loss"] <= oe.TOLERANCE


def test_coop_matches_official_logits_and_loss(coop_case):
    fixture, *inputs = coop_case
    logits, loss = _ours(fixture, *inputs)
    assert logits.shape == (fixture["batch"], len(fixture["classnames"]))
    assert oe.relative_max_difference(logits, fixture["official_logits"]) <= oe.TOLERANCE
    assert oe.relative_max_difference(loss, fixture["official_loss"]) <= oe.TOLERANCE


def test_coop_misplaced_context_token_fails_the_comparison(coop_case):
    fixture, weights_path, learnables, images, labels = coop_case
    swapped = {name: value.flip(0) for name, value in learnables.items()}  # ctx tokens in reverse order
    logits, _ = _ours(fixture, weights_path, swapped, images, labels)
    assert oe.relative_max_difference(logits, fixture["official_logits"]) > oe.TOLERANCE


def test_relative_max_difference_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="Shapes differ"):
        oe.relative_max_difference([[1.0, 2.0]], [[1.0], [2.0]])
