"""Shared fixtures: a tiny random CLIP saved to local files."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from vlprompt.testing import TINY_CLIP_CONFIG, write_tiny_clip  # noqa: E402

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
