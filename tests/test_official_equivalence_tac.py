"""TAC against its official code, FushengHao/TAC (committed fixture tac.json).

tools/official_equivalence.py ran the official trainers/tac.py CustomCLIP (commit in the fixture)
on a seeded random CLIP ViT-B/16 with T_1, the 11 deep text and 12 vision prompts and the maps
G -> G_t, G -> G_v all drawn away from their inits, the same seeded unit centres G on both sides,
and a seeded batch of 2 images (2 views each for the loss) and 3 classes. Our TACCLIP, rebuilt
from the same seeds with the fixture's parameter-name mapping, must give the same logits and
training loss within 3e-3; prompts, maps or centres put in the wrong place must fail.
"""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import official_equivalence as oe  # noqa: E402  (tools/official_equivalence.py)
from official_methods import tac as tac_spec  # noqa: E402

METHOD = "TAC"


@pytest.fixture(scope="module")
def fixture():
    with open(os.path.join(oe.FIXTURE_DIR, "tac.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    path, resolution, width = official_weights(fixture["backbone"], fixture["seeds"]["weights"])
    learnables, images, labels = oe.make_inputs(METHOD, resolution, width, fixture["seeds"], fixture["batch"],
                                                len(fixture["classnames"]))
    assert labels.tolist() == fixture["labels"]
    return path, learnables, images, labels


def _ours(fixture, case, learnables=None):
    path, default, images, labels = case
    return oe.our_outputs(METHOD, fixture["backbone"], path, fixture["classnames"], learnables or default, images,
                          labels)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "FushengHao/TAC"
    assert fixture["official_commit"].startswith("914c3067")
    assert set(fixture["official_outputs"]) == {"logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[METHOD]["learnables"].items()}
    assert mapping["text_map.weight"] == "VPT_topk_t.weight" and mapping["vision_prompts.0"] == "image_encoder.VPT"
    assert len(mapping) == 1 + 4 + 11 + 12  # T_1, the two maps (weight, bias), T_2..T_12, V_1..V_12


def test_matches_official_outputs(fixture, case):
    ours = _ours(fixture, case)
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("misplacement", ["ctx tokens reversed", "deep text prompts of layers 2 and 3 swapped",
                                          "vision prompts of layers 1 and 2 swapped", "maps swapped bias rows"])
def test_misplaced_prompt_fails_the_comparison(fixture, case, misplacement):
    learnables = dict(case[1])
    if misplacement == "ctx tokens reversed":
        learnables["ctx"] = learnables["ctx"].flip(0)
    elif misplacement == "deep text prompts of layers 2 and 3 swapped":
        learnables["text_prompts.0"], learnables["text_prompts.1"] = case[1]["text_prompts.1"], case[1]["text_prompts.0"]
    elif misplacement == "vision prompts of layers 1 and 2 swapped":
        learnables["vision_prompts.0"], learnables["vision_prompts.1"] = (case[1]["vision_prompts.1"],
                                                                          case[1]["vision_prompts.0"])
    else:
        learnables["vision_map.bias"] = learnables["vision_map.bias"].flip(0)
    ours = _ours(fixture, case, learnables)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_other_centres_fail_the_comparison(fixture, case, monkeypatch):
    monkeypatch.setattr(tac_spec, "centres", lambda embed_dim=512: torch.roll(
        torch.nn.functional.normalize(torch.randn(5, embed_dim, generator=torch.Generator().manual_seed(9)), dim=-1),
        1, 0))
    ours = _ours(fixture, case)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE
