"""FT's model and WiSE-FT's interpolation against mlfoundations/wise-ft (committed fixture wiseft.json).

tools/official_wiseft.py ran wise-ft's own get_zeroshot_classifier, ClassificationHead,
ImageClassifier (vendored clip, fp32, CPU), CrossEntropyLoss and src/wise_ft.py's _merge (α = 0.5)
on a seeded random ViT-B/16 (zero-shot end) and a second one whose head is the zero-shot head plus
N(0, 1) noise (fine-tuned end), with a seeded batch of 2 images and 3 classes. Our FineTunedCLIP
and ``interpolate``, rebuilt from the same seeds, must give the same head, logits, loss and
WiSE-FT logits within 3e-3 (measured: at most 7.9e-7); α = 0.3 instead of 0.5 must fail.
"""
import pytest

from official_cases import load_fixture, oe

import official_wiseft  # noqa: E402  (tools/official_wiseft.py; official_cases put tools/ on sys.path)


@pytest.fixture(scope="module")
def fixture():
    return load_fixture("wiseft")


@pytest.fixture(scope="module")
def case(fixture, official_weights):
    """(zero-shot weights file, fine-tuned weights file, images, labels, head noise)."""
    seeds = fixture["seeds"]
    zs_path, resolution, _ = official_weights(fixture["backbone"], seeds["weights"])
    ft_path, _, _ = official_weights(fixture["backbone"], seeds["finetuned_weights"])
    embed = len(fixture["official_outputs"]["head_weight"][0])
    images, labels, noise = official_wiseft.make_inputs(resolution, embed, len(fixture["classnames"]),
                                                        fixture["batch"], seeds)
    assert labels.tolist() == fixture["labels"]
    return zs_path, ft_path, images, labels, noise


def outputs(fixture, case, alpha=None):
    zs_path, ft_path, images, labels, noise = case
    return official_wiseft.our_outputs(zs_path, ft_path, fixture["classnames"], images, labels, noise,
                                       fixture["alpha"] if alpha is None else alpha)


def test_fixture_records_the_official_run(fixture):
    assert fixture["official_repository"] == "mlfoundations/wise-ft"
    assert fixture["official_commit"].startswith("58b7a4b3") and fixture["alpha"] == 0.5
    assert set(fixture["official_outputs"]) == set(official_wiseft.OUTPUTS)
    assert all(value <= oe.TOLERANCE for value in fixture["relative_max_difference"].values())


def test_matches_official_outputs_and_a_wrong_alpha_does_not(fixture, case):
    ours = outputs(fixture, case)
    for key, official in fixture["official_outputs"].items():
        assert oe.relative_max_difference(ours[key], official) <= oe.TOLERANCE, key
    moved = outputs(fixture, case, alpha=0.3)
    assert oe.relative_max_difference(moved["wise_logits"], fixture["official_outputs"]["wise_logits"]) > oe.TOLERANCE
