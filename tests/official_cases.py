"""Set-up shared by the official side-by-side tests (tests/test_official_equivalence*.py).

A fixture is one committed JSON file of tests/fixtures/official/, written by
tools/official_equivalence.py from a run of the official code; a case is our side's inputs rebuilt
from the fixture's seeds. ``oe`` is tools/official_equivalence.py (tools/ is put on sys.path here).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import official_equivalence as oe  # noqa: E402  (tools/official_equivalence.py)

__all__ = ["build_case", "load_fixture", "oe", "our_outputs"]


def load_fixture(name):
    """The fixture dict of tests/fixtures/official/<name>.json (``name`` e.g. "maple", "dept-maple"):
    method, backbone, seeds, batch, classnames, labels, parameter_mapping, official_outputs, ..."""
    with open(os.path.join(oe.FIXTURE_DIR, f"{name}.json")) as f:
        return json.load(f)


def build_case(fixture, official_weights):
    """(weights file, learnable values {our name: tensor}, images [B, 3, R, R], labels [B]) of the
    fixture's method, rebuilt from its seeds; ``official_weights`` is the conftest fixture
    (backbone, seed) -> (weights file, input resolution R, text width). The labels must be the
    fixture's."""
    path, resolution, width = official_weights(fixture["backbone"], fixture["seeds"]["weights"])
    learnables, images, labels = oe.make_inputs(fixture["method"], resolution, width, fixture["seeds"],
                                                fixture["batch"], len(fixture["classnames"]))
    assert labels.tolist() == fixture["labels"]
    return path, learnables, images, labels


def our_outputs(fixture, case, learnables=None, node_changes=None):
    """Our model's outputs {name: tensor} on a case of ``build_case``, with its learnable values
    unless ``learnables`` {our name: tensor} is given, and our config node changed by
    ``node_changes`` {key: value} (how a test misplaces a component)."""
    path, default, images, labels = case
    return oe.our_outputs(fixture["method"], fixture["backbone"], path, fixture["classnames"],
                          default if learnables is None else learnables, images, labels, node_changes)
