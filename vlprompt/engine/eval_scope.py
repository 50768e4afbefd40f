"""Evaluation scopes: what an evaluation's classes are to the model that is evaluated.

Every evaluation has one scope:

* ``base``: the training classes of the training dataset (base-to-novel "Base");
* ``new``: the held-out classes of the training dataset (base-to-novel "Novel");
* ``source``: all classes of the training dataset (few-shot; the source of cross-dataset
  and domain-generalization transfer);
* ``target``: another dataset (cross-dataset targets, and the shifted sets of domain
  generalization such as ImageNet-V2/-Sketch/-A/-R).

The scope is ``TEST.ROLE`` ("" = inferred; ``--eval-role`` in train.py). The key and the flag keep
their names; "role" elsewhere in the project means an attention head's role in DeAR.
:func:`infer_eval_scope` is the one place that infers the scope:

* a training run evaluates its own training classes: ``source`` with
  DATASET.SUBSAMPLE_CLASSES all, ``base`` with base;
* an ``--eval-only`` run with ``--model-dir`` compares DATASET.NAME with the dataset the model
  was trained on, read from the training run's folder (``config.yaml``, written by train.py
  when it trains, or else a training run's ``results.json``): another dataset is ``target``;
  the same dataset is ``base``/``new``/``source`` for SUBSAMPLE_CLASSES base/new/all;
* an ``--eval-only`` run without a model folder (zero-shot methods) uses the same-dataset rule.

Methods read the scope as ``ClipTrainer.eval_scope`` (or :func:`eval_scope` of a config), and a
method option whose value depends on it is a :class:`~vlprompt.engine.option_rules.ScopeRule`:
its value ``auto`` picks one value per scope, explicit values override.
"""
from dataclasses import dataclass
from typing import Mapping, Optional

from vlprompt.config import ConfigError

from .run_folder import CONFIG_FILENAME, RESULTS_FILENAME, RunFolder

__all__ = [
    "EVAL_SCOPES", "EvalScope", "check_eval_scope", "infer_eval_scope", "resolve_eval_scope", "eval_scope",
    "trained_dataset",
]

EVAL_SCOPES = ("base", "new", "source", "target")

_SAME_DATASET_SCOPES = {"base": "base", "new": "new", "all": "source"}


@dataclass(frozen=True)
class EvalScope:
    """A resolved evaluation scope, why it is that one (for the log) and a warning ("" if none)."""

    scope: str
    reason: str
    warning: str = ""


def check_eval_scope(value, key="TEST.ROLE"):
    """Raise ConfigError unless ``value`` is "" (infer it) or one of EVAL_SCOPES."""
    if value not in ("",) + EVAL_SCOPES:
        raise ConfigError(
            f"{key} (--eval-role) must be one of {', '.join(EVAL_SCOPES)} (base: the training classes, "
            f"new: the held-out classes, source: all classes of the training dataset, target: another "
            f'dataset), or "" to infer it; got {value!r}.'
        )


def trained_dataset(model_dir) -> Optional[Mapping[str, str]]:
    """The dataset a training run folder was trained on (:meth:`RunFolder.trained_dataset`).

    Raises:
        ConfigError: a record exists but cannot be read; the message says how to go on.
    """
    try:
        return RunFolder(model_dir).trained_dataset()
    except ConfigError as error:
        raise ConfigError(f"{error} Or give the evaluation scope with --eval-role.") from None


def infer_eval_scope(cfg, eval_only=False, model_dir="") -> EvalScope:
    """The scope of this run's evaluation, from the run itself (module docstring); ignores TEST.ROLE."""
    name, subsample = cfg.DATASET.NAME, cfg.DATASET.SUBSAMPLE_CLASSES
    if subsample not in _SAME_DATASET_SCOPES:
        raise ConfigError(
            f"DATASET.SUBSAMPLE_CLASSES must be one of {list(_SAME_DATASET_SCOPES)}, got {subsample!r}."
        )
    same = _SAME_DATASET_SCOPES[subsample]
    if not eval_only:
        scope = "source" if subsample == "all" else "base"
        return EvalScope(scope, f"a training run evaluates its training classes ({subsample} classes of {name})")
    if not model_dir:
        return EvalScope(same, f"no trained model: the {subsample} classes of {name}")
    trained = trained_dataset(model_dir)
    if trained is None:
        return EvalScope(
            same, f"the {subsample} classes of {name}, assumed to be the model's training dataset",
            warning=f'"{model_dir}" records no training dataset ({CONFIG_FILENAME} or a training '
                    f"{RESULTS_FILENAME}), so the model is assumed to be trained on {name}; pass "
                    "--eval-role target if it was trained on another dataset.",
        )
    if trained["name"] != name:
        return EvalScope("target", f"the model was trained on {trained['name']} ({trained['record']}), "
                                  f"this run evaluates {name}")
    return EvalScope(same, f"the {subsample} classes of {name}, the model's training dataset")


def resolve_eval_scope(cfg, eval_only=False, model_dir="") -> EvalScope:
    """TEST.ROLE when set (it wins over the inferred scope), else :func:`infer_eval_scope`."""
    given = cfg.TEST.ROLE
    check_eval_scope(given)
    inferred = infer_eval_scope(cfg, eval_only, model_dir)
    if not given:
        return inferred
    note = "" if given == inferred.scope else f"; inferred from the run it would be {inferred.scope}: {inferred.reason}"
    return EvalScope(given, f"given by TEST.ROLE / --eval-role{note}")


def eval_scope(cfg) -> str:
    """The evaluation scope of a config: TEST.ROLE, or when it is "" the same-dataset rule.

    train.py always stores the resolved scope in TEST.ROLE; the fallback serves trainers built
    directly from a config (``build_trainer(cfg)``), which evaluate the classes they were built on.
    """
    check_eval_scope(cfg.TEST.ROLE)
    return cfg.TEST.ROLE or infer_eval_scope(cfg, eval_only=True).scope
