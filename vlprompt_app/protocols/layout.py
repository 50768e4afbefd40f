"""Output folders of the CoOp-family evaluation protocols.

One place says where each run of each protocol writes, so that the protocol runner and
the results tool agree, and the reference ``parse_test_res.py`` works on our outputs:

==========================  =====================================================================
base-to-novel, training     ``ROOT/base2new/train_base/DATASET/shots_K/TRAINER/CFG/seedS``
base-to-novel, novel test   ``ROOT/base2new/test_new/DATASET/shots_K/TRAINER/CFG/seedS``
base-to-novel, base test    ``ROOT/base2new/test_base/...`` (released weights; same tail)
few-shot, xd/DG training    ``ROOT/DATASET/TRAINER/CFG_Kshots/seedS``
xd/DG evaluation            ``ROOT/evaluation/TRAINER/CFG_Kshots/DATASET/seedS``
fft training, evaluation    as xd/DG with ``K`` = 0 (the whole training set), one folder per stage
test-time (ttt)             ``ROOT/ttt/TRAINER/CFG/SOURCE_MODEL/DATASET/seedS``
==========================  =====================================================================

``SOURCE_MODEL`` of a test-time run is ``none`` (the method starts from CLIP) or
``SRCTRAINER-SRCCFG_Kshots`` (it starts from the source model trained in
``ROOT/SOURCE/SRCTRAINER/SRCCFG_Kshots/seedS``, the same seed).

``DATASET`` is the dataset YAML's file stem (``oxford_pets``), ``CFG`` the method YAML's
stem, ``K`` the number of shots ([decision] ``0`` for zero-shot methods in the few-shot
protocol, which are evaluated once, not per shot count).

Only the standard library is imported here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

__all__ = [
    "BASE2NEW_DIR", "TRAIN_BASE", "TEST_BASE", "TEST_NEW", "EVALUATION_DIR", "TTT_DIR", "NO_SOURCE_MODEL",
    "RESERVED_DIRS", "RunKey", "base2new_run_dir", "fewshot_run_dir", "evaluation_run_dir", "source_model_name",
    "ttt_run_dir", "parse_run_path",
]

BASE2NEW_DIR = "base2new"
TRAIN_BASE = "train_base"
TEST_BASE = "test_base"
TEST_NEW = "test_new"
EVALUATION_DIR = "evaluation"
TTT_DIR = "ttt"
NO_SOURCE_MODEL = "none"
RESERVED_DIRS = (BASE2NEW_DIR, EVALUATION_DIR, TTT_DIR)
"""First-level folders of ROOT that are not dataset names."""

_SEED = re.compile(r"^seed(\d+)$")
_SHOTS_B2N = re.compile(r"^shots_(\d+)$")
_CFG_SHOTS = re.compile(r"^(.+)_(\d+)shots$")
_SOURCE_MODEL = re.compile(r"^([^-]+)-(.+)_(\d+)shots$")


@dataclass(frozen=True)
class RunKey:
    """What a run folder's path says about the run.

    Attributes:
        kind: ``train_base``, ``test_base`` or ``test_new`` (base-to-novel), ``train``
            (few-shot and cross-dataset/DG training: DATASET/TRAINER/CFG_Kshots/seedS) or
            ``evaluation`` (cross-dataset/DG/fft targets) or ``ttt`` (test-time runs).
        dataset: dataset YAML stem (the evaluated dataset).
        trainer, cfg: trainer name and method YAML stem; for a ttt run with a source model
            ``CFG@SRCTRAINER-SRCCFG_Kshots`` (a method of its own in the tables).
        shots: number of shots of the training data (ttt: of the source model, 0 without one).
        seed: the seed number as text.
    """

    kind: str
    dataset: str
    trainer: str
    cfg: str
    shots: int
    seed: str


def base2new_run_dir(root, side: str, dataset: str, shots: int, trainer: str, cfg: str,
                     seed: int) -> Path:
    """``ROOT/base2new/SIDE/DATASET/shots_K/TRAINER/CFG/seedS`` (SIDE: train_base, test_new, test_base)."""
    if side not in (TRAIN_BASE, TEST_BASE, TEST_NEW):
        raise ValueError(f"side must be {TRAIN_BASE}, {TEST_BASE} or {TEST_NEW}, got {side!r}")
    return Path(root, BASE2NEW_DIR, side, dataset, f"shots_{shots}", trainer, cfg, f"seed{seed}")


def fewshot_run_dir(root, dataset: str, trainer: str, cfg: str, shots: int, seed: int) -> Path:
    """``ROOT/DATASET/TRAINER/CFG_Kshots/seedS``: few-shot runs and the xd/DG source training."""
    if dataset in RESERVED_DIRS:
        raise ValueError(f"a dataset cannot be called {dataset!r}: that folder name is reserved")
    return Path(root, dataset, trainer, f"{cfg}_{shots}shots", f"seed{seed}")


def evaluation_run_dir(root, trainer: str, cfg: str, shots: int, dataset: str, seed: int) -> Path:
    """``ROOT/evaluation/TRAINER/CFG_Kshots/DATASET/seedS``: a cross-dataset or DG target."""
    return Path(root, EVALUATION_DIR, trainer, f"{cfg}_{shots}shots", dataset, f"seed{seed}")


def source_model_name(trainer: Optional[str] = None, cfg: Optional[str] = None, shots: int = 0) -> str:
    """``SRCTRAINER-SRCCFG_Kshots``, or ``none`` without a source model (``trainer`` None)."""
    if trainer is None:
        return NO_SOURCE_MODEL
    if "-" in trainer:
        raise ValueError(f"a source-model trainer name cannot contain '-', got {trainer!r}")
    return f"{trainer}-{cfg}_{shots}shots"


def ttt_run_dir(root, trainer: str, cfg: str, source_model: str, dataset: str, seed: int) -> Path:
    """``ROOT/ttt/TRAINER/CFG/SOURCE_MODEL/DATASET/seedS``: a test-time run on a target
    (``source_model`` from :func:`source_model_name`)."""
    return Path(root, TTT_DIR, trainer, cfg, source_model, dataset, f"seed{seed}")


def _parse_ttt(parts: Tuple[str, ...], seed: str) -> Optional[RunKey]:
    if len(parts) != 6:
        return None
    trainer, cfg, source, dataset = parts[1:5]
    if source == NO_SOURCE_MODEL:
        return RunKey(TTT_DIR, dataset, trainer, cfg, 0, seed)
    match = _SOURCE_MODEL.match(source)
    if match is None:
        return None
    return RunKey(TTT_DIR, dataset, trainer, f"{cfg}@{source}", int(match.group(3)), seed)


def parse_run_path(parts: Sequence[str]) -> Optional[RunKey]:
    """The RunKey of a run folder given its path parts relative to ROOT, or None.

    Example: ``("base2new", "test_new", "dtd", "shots_16", "CoOp", "vit_b16_ctxv1", "seed2")``
    -> RunKey("test_new", "dtd", "CoOp", "vit_b16_ctxv1", 16, "2").
    """
    parts = tuple(parts)
    if not parts:
        return None
    seed = _SEED.match(parts[-1])
    if seed is None:
        return None
    if parts[0] == BASE2NEW_DIR:
        if len(parts) != 7 or parts[1] not in (TRAIN_BASE, TEST_BASE, TEST_NEW):
            return None
        shots = _SHOTS_B2N.match(parts[3])
        if shots is None:
            return None
        return RunKey(parts[1], parts[2], parts[4], parts[5], int(shots.group(1)), seed.group(1))
    if parts[0] == TTT_DIR:
        return _parse_ttt(parts, seed.group(1))
    if parts[0] == EVALUATION_DIR:
        cfg_shots = _CFG_SHOTS.match(parts[2]) if len(parts) == 5 else None
        if cfg_shots is None:
            return None
        return RunKey("evaluation", parts[3], parts[1], cfg_shots.group(1), int(cfg_shots.group(2)),
                      seed.group(1))
    cfg_shots = _CFG_SHOTS.match(parts[2]) if len(parts) == 4 else None
    if cfg_shots is None:
        return None
    return RunKey("train", parts[0], parts[1], cfg_shots.group(1), int(cfg_shots.group(2)),
                  seed.group(1))
