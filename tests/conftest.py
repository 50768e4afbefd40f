"""Shared fixtures (a tiny random CLIP saved to local files), the ``official`` mark and the order
in which test files are handed to pytest-xdist workers."""
import fcntl
import fnmatch
import os
import sys

import pytest

# Bytecode caches are written even where the environment turns them off (PYTHONDONTWRITEBYTECODE=1,
# common in containers): pytest keeps each test module with its asserts rewritten, and Python each
# project module compiled, in the checkout's __pycache__ folders (which git ignores). Without them
# every process of every run (each xdist worker, each forked run) rewrites and compiles them again:
# about 7 s of CPU per worker to collect the fast loop. An unwritable checkout is only read.
sys.dont_write_bytecode = False


def pytest_configure(config):
    """In a process that runs tests (an xdist worker, or pytest without ``-n``): the checkout's
    trainers/ and datasets/ are imported (test modules import them by name) and open_clip's model
    construction and weights reads are memoised (tests/clip_memo.py). The xdist controller, which
    runs no test, imports none of it (torch, open_clip and the project cost about 6 s of CPU before
    the workers start). Under pytest-xdist (``-n N``), each of the N worker processes gets an
    equal share of the CPU cores as torch threads, and so do the processes its tests start
    (OMP_NUM_THREADS, unless set), so that the workers and their runs do not oversubscribe the
    machine."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None)):
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        torch.set_num_threads(share)
    from vlprompt_app.project import import_project

    import_project()
    import clip_memo

    clip_memo.install()  # repeated tiny-CLIP constructions and weights reads (tests/clip_memo.py)


@pytest.fixture(scope="session")
def tiny_clip_files(tmp_path_factory):
    """(config_json, weights_pt) of a tiny random CLIP, shared by the session."""
    from vlprompt.testing import write_tiny_clip

    return write_tiny_clip(str(tmp_path_factory.mktemp("tiny_clip")), name="tiny-clip-test")


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """A data root holding the rendered SyntheticShapes set, rendered once per test session and
    shared by the xdist workers (under their common temporary folder, behind a file lock); tests
    read it and may add split files, which the library writes atomically."""
    from vlprompt.synthetic.downstream import SETS, ensure_dataset

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's own
    with open(base / "synthetic_data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_dataset(str(base / "synthetic_data"), SETS["SyntheticShapes"])
    return base / "synthetic_data"


# Test files by cost, heaviest first (per-file sums of a ``--durations`` record of the suite).
# Under ``--dist loadfile --no-loadscope-reorder`` pytest-xdist hands files to the workers in
# collection order, so these start first and the cheap files fill in around them; the other files
# follow, those with the most tests first.
HEAVIEST_FILES = (
    "test_compile.py", "test_fidelity.py", "test_readme.py", "test_predict_all_trainers.py",
    "test_mixed_precision.py", "test_kill_resume.py", "test_gpu_acceptance.py", "test_trainer_families.py",
    "test_run_protocol.py", "test_ddp_gloo.py", "test_role_map_provenance.py", "test_tools_cwd.py",
    "test_readme_own_images.py", "test_kill_resume_protocols.py", "test_synthetic_benchmark.py", "test_predict.py",
    "test_run_lock.py", "test_clip_runner.py", "test_kill_resume_ttt.py", "test_fft_ttt_protocols.py",
    "test_reliability.py", "test_fidelity_cost.py",
)
OFFICIAL_FILES = ("test_fidelity*.py",)


def pytest_collection_modifyitems(config, items):
    """Mark the official-code comparisons ``official`` (by file name) and order the files by
    cost (HEAVIEST_FILES first; within a file the order is kept)."""
    counts = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1
        if any(fnmatch.fnmatch(item.path.name, pattern) for pattern in OFFICIAL_FILES):
            item.add_marker(pytest.mark.official)

    def cost_rank(item):
        name = item.path.name
        if name in HEAVIEST_FILES:
            return HEAVIEST_FILES.index(name), 0, str(item.path)
        return len(HEAVIEST_FILES), -counts[item.path], str(item.path)

    items.sort(key=cost_rank)
