"""Shared fixtures: a tiny random CLIP saved to local files."""
import os

import pytest

from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip
from vlprompt_app.project import import_project

import_project()  # the checkout's trainers/ and datasets/: test modules import them by name

__all__ = ["TINY_CLIP_CONFIG", "write_tiny_clip"]


def pytest_configure(config):
    """Under pytest-xdist (``-n N``), each of the N worker processes gets an equal share of the
    CPU cores as torch threads, so that the workers do not oversubscribe the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


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
