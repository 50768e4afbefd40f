"""ATPrompt against the official code, zhengli97/ATPrompt (committed fixtures atprompt.json and
atprompt-maple.json).

tools/official_equivalence.py ran the official CustomCLIP of trainers/coop_atp.py (on CoOp) and of
trainers/maple_atp.py (on MaPLe; commit in the fixtures) on a seeded random CLIP ViT-B/16, with the
attributes "color" and "shape" (2 soft tokens each), the context, the attribute tokens and on MaPLe
the deep prompts and couplings all drawn at 10x their init std, its unused third attribute tensor
set to NaN, and a seeded batch of 2 images and 3 classes. Our ATPromptCLIP, rebuilt from the same
seeds with the fixtures' parameter-name mapping, must give the same logits and cross-entropy within
3e-3; attribute tokens or words put in the wrong place must fail.
"""
import os
import subprocess

import pytest

from official_cases import build_case, load_fixture, oe, our_outputs

FIXTURES = {"ATPrompt": "atprompt", "ATPrompt-MaPLe": "atprompt-maple"}


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def method(request):
    return request.param


@pytest.fixture(scope="module")
def fixture(method):
    return load_fixture(FIXTURES[method])


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B])."""
    return build_case(fixture, official_weights)


def test_fixture_records_the_official_run(method, fixture):
    assert fixture["official_repository"] == "zhengli97/ATPrompt"
    assert fixture["official_commit"].startswith("86980a10") and fixture["dassl_commit"] == fixture["official_commit"]
    assert fixture["official_cfg"]["TRAINER.ATPROMPT"]["ATT_NUM"] == 2
    assert set(fixture["official_outputs"]) == {"logits", "loss"}
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())
    mapping = fixture["parameter_mapping"]
    assert mapping == {name: entry["official"] for name, entry in oe.METHODS[method]["learnables"].items()}
    assert mapping["attributes.soft.0"] == "prompt_learner.ctx_att1"
    assert mapping["attributes.soft.1"] == "prompt_learner.ctx_att2"
    assert mapping["base.prompt_learner.ctx"] == "prompt_learner.ctx"
    assert len(mapping) == (3 if method == "ATPrompt" else 3 + 2 * 9 + 8)


def test_matches_official_outputs(method, fixture, case):
    ours = our_outputs(fixture, case)
    assert ours["logits"].shape == (fixture["batch"], len(fixture["classnames"]))
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key


@pytest.mark.parametrize("misplacement", ["attribute tokens swapped", "attribute words swapped",
                                          "one soft token per attribute position"])
def test_misplaced_attributes_fail_the_comparison(method, fixture, case, misplacement):
    learnables, changes = dict(case[1]), {}
    if misplacement == "attribute tokens swapped":
        learnables["attributes.soft.0"], learnables["attributes.soft.1"] = (case[1]["attributes.soft.1"],
                                                                            case[1]["attributes.soft.0"])
    elif misplacement == "attribute words swapped":
        changes["WORDS"] = ["shape", "color"]
    else:  # A_1 = its first token only, A_2 = the rest: every later position moves by one
        changes["N_ATT"] = 1
        first = case[1]["attributes.soft.0"]
        learnables["attributes.soft.0"], learnables["attributes.soft.1"] = first[:1], first[1:]
    ours = our_outputs(fixture, case, learnables, changes)
    assert oe.relative_max_difference(ours["logits"], fixture["official_outputs"]["logits"]) > oe.TOLERANCE


def test_export_leaves_out_the_files_a_repository_copy_lacks(tmp_path, capsys):
    """The tool's copy of zhengli97/ATPrompt lacks its large checkpoint files, which git archive
    refuses: HEAD is then exported file by file without them, named."""
    repo, target = tmp_path / "repo", tmp_path / "export"
    (repo / "trainers").mkdir(parents=True)
    (repo / "trainers" / "coop_atp.py").write_text("N_ATT = 2\n")
    (repo / "weights.pth").write_bytes(b"large")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run(git + command, check=True)
    blob = subprocess.run(git + ["rev-parse", "HEAD:weights.pth"], check=True, capture_output=True, text=True).stdout
    os.remove(repo / ".git" / "objects" / blob[:2] / blob.strip()[2:])
    commit = oe._export(str(repo), str(target))
    assert len(commit) == 40
    assert (target / "trainers" / "coop_atp.py").read_text() == "N_ATT = 2\n"
    assert not (target / "weights.pth").exists()
    assert "leaving out the files it lacks (1): weights.pth" in capsys.readouterr().out
