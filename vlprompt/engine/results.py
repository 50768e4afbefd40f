"""The record of a final evaluation, which :class:`~vlprompt.engine.run_folder.RunFolder` writes as ``results.json``.

[decision] Besides Dassl's one-decimal "=> result" block in log.txt, every
final evaluation (the test after training, or an eval-only test) writes ``results.json``
atomically, with the evaluator's metrics at full precision and the evaluation scope
(:mod:`vlprompt.engine.eval_scope`), so that result parsers need not scrape logs.

A training run also writes its merged config as ``config.yaml`` (detectron2's name) when it
starts (:meth:`RunFolder.write_config`), so that a later ``--eval-only --model-dir`` run knows
what the model was trained on.
"""
import datetime
from pathlib import Path
from typing import Mapping, Optional

from vlprompt.version import __version__

RUN_INFO_DEFAULTS = {
    "config_file": "",
    "dataset_config_file": "",
    "eval_only": False,
    "model_dir": "",
    "load_epoch": None,
}
"""Facts about the run that are not in the config; train.py fills them (``TrainerBase.run_info``)."""


def make_results_record(
    cfg,
    run_info: Mapping,
    split: str,
    metrics: Mapping[str, float],
    num_classes: int,
    num_test: int,
    epoch: int,
    wall_time_s: float,
    skipped_images: Optional[Mapping[str, int]] = None,
    skipped_nonfinite_steps: int = 0,
) -> dict:
    """Build the results record (a JSON-ready dict) of one evaluation.

    Args:
        cfg: the run's (frozen) config; TEST.ROLE gives "eval_role", the evaluation scope (see ``eval_scope.eval_scope``).
        run_info: the keys of ``RUN_INFO_DEFAULTS``.
        split: the split actually evaluated ("val" or "test").
        metrics: the evaluator's result dict (name -> number).
        num_classes: number of classes of the evaluated class set.
        num_test: number of evaluated samples.
        epoch: number of completed training epochs of the evaluated weights (0 for zero-shot).
        wall_time_s: seconds from building the trainer to now.
        skipped_images: {"train"|"val"|"test": unreadable images left out} (DATASET.SKIP_BAD_IMAGES).
        skipped_nonfinite_steps: training steps skipped for a non-finite loss (TRAIN.NONFINITE_LOSS skip).
    """
    from .eval_scope import eval_scope  # roles reads the records this module writes

    skipped_images = {split: int((skipped_images or {}).get(split, 0)) for split in ("train", "val", "test")}
    dataset_config_file = run_info["dataset_config_file"]
    return {
        "trainer": cfg.TRAINER.NAME,
        "config_file": run_info["config_file"],
        "dataset_config_file": dataset_config_file,
        "dataset": cfg.DATASET.NAME,
        "dataset_config": Path(dataset_config_file).stem if dataset_config_file else "",
        "num_shots": cfg.DATASET.NUM_SHOTS,
        "subsample_classes": cfg.DATASET.SUBSAMPLE_CLASSES,
        "seed": cfg.SEED,
        "backbone": cfg.MODEL.BACKBONE.NAME,
        "split": split,
        "eval_role": eval_scope(cfg),
        "epoch": int(epoch),
        "eval_only": bool(run_info["eval_only"]),
        "model_dir": run_info["model_dir"],
        "load_epoch": run_info["load_epoch"],
        "metrics": {name: float(value) for name, value in metrics.items()},
        "num_classes": int(num_classes),
        "num_test": int(num_test),
        "wall_time_s": float(wall_time_s),
        "skipped_images": skipped_images,
        "skipped_nonfinite_steps": int(skipped_nonfinite_steps),
        "completed": True,
        "finished_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "output_dir": cfg.OUTPUT_DIR,
        "vlprompt_version": __version__,
    }
