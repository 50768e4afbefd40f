"""Shared fixtures: a tiny random CLIP saved to local files."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip  # noqa: E402

__all__ = ["TINY_CLIP_CONFIG", "write_tiny_clip"]


@pytest.fixture(scope="session")
def tiny_clip_files(tmp_path_factory):
    """(config_json, weights_pt) of a tiny random CLIP, shared by the session."""
    return write_tiny_clip(str(tmp_path_factory.mktemp("tiny_clip")), name="tiny-clip-test")


@pytest.fixture(scope="session")
def official_weights(tmp_path_factory):
    """``get(backbone, seed) -> (weights file, input resolution, text width)``: the seeded random
    CLIP of tools/official_equivalence.py, each file written once per session (ViT-B/16 is about
    600 MB) and shared by the official-equivalence test modules (which put tools/ on sys.path)."""
    import importlib

    writer = importlib.import_module("official_equivalence").write_weights
    files = {}

    def get(backbone, seed):
        if (backbone, seed) not in files:
            path = str(tmp_path_factory.mktemp("clip") / "weights.pt")
            files[backbone, seed] = (path, *writer(backbone, seed, path))
        return files[backbone, seed]

    return get
