"""Evaluation roles: what an evaluation's classes are to the model that is evaluated.

Every evaluation has one role:

* ``base``: the training classes of the training dataset (base-to-novel "Base");
* ``new``: the held-out classes of the training dataset (base-to-novel "Novel");
* ``source``: all classes of the training dataset (few-shot; the source of cross-dataset
  and domain-generalization transfer);
* ``target``: another dataset (cross-dataset targets, and the shifted sets of domain
  generalization such as ImageNet-V2/-Sketch/-A/-R).

The role is ``TEST.ROLE`` ("" = inferred; ``--eval-role`` in train.py). :func:`infer_eval_role`
is the one place that infers it:

* a training run evaluates its own training classes: ``source`` with
  DATASET.SUBSAMPLE_CLASSES all, ``base`` with base;
* an ``--eval-only`` run with ``--model-dir`` compares DATASET.NAME with the dataset the model
  was trained on, read from the training run's folder (``config.yaml``, written by train.py
  when it trains, or else a training run's ``results.json``): another dataset is ``target``;
  the same dataset is ``base``/``new``/``source`` for SUBSAMPLE_CLASSES base/new/all;
* an ``--eval-only`` run without a model folder (zero-shot methods) uses the same-dataset rule.

Methods read the role as ``ClipTrainer.eval_role`` (or :func:`eval_role` of a config), and a
method option whose value depends on it is a :class:`~vlprompt.engine.option_rules.RoleRule`:
its value ``auto`` picks one value per role, explicit values override.
"""
from dataclasses import dataclass
from typing import Mapping, Optional

from vlprompt.config import ConfigError

from .run_folder import CONFIG_FILENAME, RESULTS_FILENAME, RunFolder

__all__ = [
    "EVAL_ROLES", "EvalRole", "check_eval_role", "infer_eval_role", "resolve_eval_role", "eval_role",
    "trained_dataset",
]

EVAL_ROLES = ("base", "new", "source", "target")

_SAME_DATASET_ROLES = {"base": "base", "new": "new", "all": "source"}


@dataclass(frozen=True)
class EvalRole:
    """A resolved evaluation role, why it is that one (for the log) and a warning ("" if none)."""

    role: str
    reason: str
    warning: str = ""


def check_eval_role(value, key="TEST.ROLE"):
    """Raise ConfigError unless ``value`` is "" (infer it) or one of EVAL_ROLES."""
    if value not in ("",) + EVAL_ROLES:
        raise ConfigError(
            f"{key} (--eval-role) must be one of {', '.join(EVAL_ROLES)} (base: the training classes, "
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
        raise ConfigError(f"{error} Or give the evaluation role with --eval-role.") from None


def infer_eval_role(cfg, eval_only=False, model_dir="") -> EvalRole:
    """The role of this run's evaluation, from the run itself (module docstring); ignores TEST.ROLE."""
    name, subsample = cfg.DATASET.NAME, cfg.DATASET.SUBSAMPLE_CLASSES
    if subsample not in _SAME_DATASET_ROLES:
        raise ConfigError(
            f"DATASET.SUBSAMPLE_CLASSES must be one of {list(_SAME_DATASET_ROLES)}, got {subsample!r}."
        )
    same = _SAME_DATASET_ROLES[subsample]
    if not eval_only:
        role = "source" if subsample == "all" else "base"
        return EvalRole(role, f"a training run evaluates its training classes ({subsample} classes of {name})")
    if not model_dir:
        return EvalRole(same, f"no trained model: the {subsample} classes of {name}")
    trained = trained_dataset(model_dir)
    if trained is None:
        return EvalRole(
            same, f"the {subsample} classes of {name}, assumed to be the model's training dataset",
            warning=f'"{model_dir}" records no training dataset ({CONFIG_FILENAME} or a training '
                    f"{RESULTS_FILENAME}), so the model is assumed to be trained on {name}; pass "
                    "--eval-role target if it was trained on another dataset.",
        )
    if trained["name"] != name:
        return EvalRole("target", f"the model was trained on {trained['name']} ({trained['record']}), "
                                  f"this run evaluates {name}")
    return EvalRole(same, f"the {subsample} classes of {name}, the model's training dataset")


def resolve_eval_role(cfg, eval_only=False, model_dir="") -> EvalRole:
    """TEST.ROLE when set (it wins over the inferred role), else :func:`infer_eval_role`."""
    given = cfg.TEST.ROLE
    check_eval_role(given)
    inferred = infer_eval_role(cfg, eval_only, model_dir)
    if not given:
        return inferred
    note = "" if given == inferred.role else f"; inferred from the run it would be {inferred.role}: {inferred.reason}"
    return EvalRole(given, f"given by TEST.ROLE / --eval-role{note}")


def eval_role(cfg) -> str:
    """The evaluation role of a config: TEST.ROLE, or when it is "" the same-dataset rule.

    train.py always stores the resolved role in TEST.ROLE; the fallback serves trainers built
    directly from a config (``build_trainer(cfg)``), which evaluate the classes they were built on.
    """
    check_eval_role(cfg.TEST.ROLE)
    return cfg.TEST.ROLE or infer_eval_role(cfg, eval_only=True).role
