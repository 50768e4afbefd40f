"""A trainer's cases of the cost benchmark, declared as data on its class (``benchmark_cases``).

Every trainer of ``trainers/`` declares, in its own class body, a tuple of ``Case``: the config
its row is measured with, what its step is (``kind``), and the project's targets. The
application (``tools/benchmark.py trainers``, the mixed-precision contract, the GPU acceptance
run) collects them from the trainer registry, so a new method adds its case in its own file::

    @TRAINER_REGISTRY.register()
    class CoOp(ClipTrainer):
        benchmark_cases = (Case("CoOp/vit_b16_ep50_ctxv1.yaml", TRAIN, train_target=2.6),)

A case's ``trainer`` is the declaring class's registered name and its ``name`` defaults to it
(the collector fills both in); a trainer with several rows names each (e.g. "RAda (images)").
"""
import os.path as osp
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

__all__ = ["TRAIN", "CACHED", "EVAL_ONLY", "TEST_TIME", "KINDS", "OFFICIAL_EVAL", "Case"]

TRAIN, CACHED, EVAL_ONLY, TEST_TIME = "train", "cached", "eval-only", "test-time"
KINDS = (TRAIN, CACHED, EVAL_ONLY, TEST_TIME)
OFFICIAL_EVAL = "2.8-3.3"  # the official implementations re-encode every class text per batch


@dataclass(frozen=True)
class Case:
    """One row of the benchmark.

    Attributes:
        config: config file under configs/trainers/.
        kind: TRAIN (train step from images), CACHED (train step from cached image features),
            EVAL_ONLY (nothing to train) or TEST_TIME (per-image adaptation during test()).
        name: row name ("" = the trainer's name; a trainer with several rows names the others).
        trainer: registered trainer name ("" in a declaration: the declaring trainer's).
        batch: fixed batch size (the paper's, when the comparison setting uses it); 0 = --batch.
        opts: KEY VALUE config overrides of this case.
        train_target, eval_target: the project's targets of the cost ratios (None: none).
        official_train, official_eval: the official implementations' ratios, measured the same way (PERFORMANCE.md).
        prepare: None, or callable(settings, output_dir) -> more KEY VALUE overrides, for a case
            that needs files before its trainer is built (PromptKD's teacher folder).
        after_build: None, or ``after_build(trainer)``, for what a trainer sets up when training
            starts (e.g. TAC's description embeddings and cluster centres).
        batch_keys: None, or ``batch_keys(trainer, batch_size)`` -> {key: tensor [B]}, what the
            trainer's training loader adds to a batch's images and labels (FLYP's caption templates).
        synthetic: the config of the synthetic benchmark under configs/trainers/ that the
            mixed-precision contract and the CUDA parity build the case from; "" =
            ``synthetic.yaml`` beside ``config``.
        synthetic_opts: KEY VALUE overrides over ``synthetic`` (a variant whose trainer has one
            synthetic config, e.g. DePT on CoOp).
    """

    config: str
    kind: str
    name: str = ""
    trainer: str = ""
    batch: int = 0
    opts: Tuple[str, ...] = ()
    train_target: Optional[float] = None
    eval_target: Optional[float] = 1.15
    official_train: Optional[float] = None
    official_eval: Optional[str] = None
    prepare: Optional[Callable] = None
    after_build: Optional[Callable] = None
    batch_keys: Optional[Callable] = None
    synthetic: str = ""
    synthetic_opts: Tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Case kind {self.kind!r} is not one of {KINDS}")

    @property
    def synthetic_config(self):
        """The case's synthetic-benchmark config, relative to configs/trainers/."""
        return self.synthetic or osp.join(osp.dirname(self.config), "synthetic.yaml")
