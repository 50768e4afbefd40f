"""Expand a protocol over methods x datasets x seeds into ``train.py`` runs.

Each protocol's phases (baselines spec §2.6, engine spec §9):

* ``base2new``: train on the base classes (``train_base``, the final test there is the Base
  accuracy), then evaluate the same checkpoint on the new classes (``test_new``).
* ``fewshot``: one training run per shot count on all classes.
* ``cross_dataset`` / ``dg``: train once on the source dataset, then evaluate that checkpoint
  on every target dataset with ``--eval-only``.

A method that learns nothing (a trainer class with ``learns = False``, e.g. ZeroshotCLIP)
is evaluated with ``--eval-only`` and no ``--model-dir`` in every phase; in the few-shot
protocol it is evaluated once (shot count 0, see :mod:`vlprompt.protocols.layout`).

Every run gets its evaluation role explicitly (``--eval-role``, see
:mod:`vlprompt.engine.roles`): ``base`` for the base-to-novel training run, ``new`` for its
new-class evaluation, ``source`` for few-shot runs and the transfer source training, ``target``
for the transfer targets (``source`` should a target be the source dataset itself).

Runs are grouped in *chains*: a training run followed by the evaluations that load its
checkpoint (``--load-epoch`` = OPTIM.MAX_EPOCH of the training config, the only epoch the
references save). A chain is the unit a backend schedules, so no evaluation waits for a
training run on another worker.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import TRAINER_REGISTRY

from .benchmark import PROTOCOLS, ProtocolDatasets
from .layout import TEST_NEW, TRAIN_BASE, base2new_run_dir, evaluation_run_dir, fewshot_run_dir

__all__ = [
    "PROTOCOL_KEYS", "Method", "Run", "Chain", "GridSpec", "resolve_method", "dataset_config_file",
    "check_opts", "merged_max_epoch", "build_grid",
]

PROTOCOL_KEYS = ("DATASET.NUM_SHOTS", "DATASET.SUBSAMPLE_CLASSES", "OUTPUT_DIR", "SEED", "TEST.ROLE")
"""Config keys the protocol sets itself; user overrides may not touch them."""

ZERO_SHOT_SHOTS = 0


@dataclass(frozen=True)
class Method:
    """One method of the grid.

    Attributes:
        trainer: registered trainer name.
        config_file: the method YAML, as passed to ``--config-file``.
        cfg: the YAML's stem, used in output paths.
        learns: False for methods that have nothing to train (evaluated with --eval-only).
    """

    trainer: str
    config_file: str
    cfg: str
    learns: bool = True

    @property
    def label(self) -> str:
        return f"{self.trainer}:{self.cfg}"


@dataclass(frozen=True)
class Run:
    """One ``train.py`` invocation.

    Attributes:
        output_dir: its ``--output-dir``.
        argv: the full ``train.py`` argument list.
        requires: output folder of the training run whose checkpoint it loads, or None.
        label: ``output_dir`` relative to the grid's output root (for progress lines).
    """

    output_dir: str
    argv: Tuple[str, ...]
    requires: Optional[str]
    label: str


@dataclass(frozen=True)
class Chain:
    """Runs executed in order on one worker: a training run, then the runs needing it."""

    runs: Tuple[Run, ...]

    @property
    def head(self) -> str:
        return self.runs[0].output_dir


@dataclass
class GridSpec:
    """Everything shared by the runs of a grid.

    Attributes:
        data_root: ``--root`` (the datasets folder).
        output_root: the output root (``output`` in the reference scripts).
        methods: the methods.
        seeds: the seeds.
        configs_dir: the repository's ``configs`` folder (dataset YAMLs are looked up there).
        opts: KEY VALUE overrides for every run; train_opts / test_opts: only for training
            runs / only for evaluation-only runs (e.g. ``TEST.SPLIT val``).
        max_epoch: callable(method, dataset_config_file, opts) -> OPTIM.MAX_EPOCH, used as
            ``--load-epoch`` (default :func:`merged_max_epoch`).
    """

    data_root: str
    output_root: str
    methods: Sequence[Method]
    seeds: Sequence[int]
    configs_dir: str
    opts: Sequence[str] = ()
    train_opts: Sequence[str] = ()
    test_opts: Sequence[str] = ()
    max_epoch: Callable[[Method, str, Sequence[str]], int] = field(default=None)

    def __post_init__(self):
        for name in ("opts", "train_opts", "test_opts"):
            check_opts(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.max_epoch is None:
            self.max_epoch = _cached(merged_max_epoch)


def _cached(function):
    cache: Dict[tuple, int] = {}

    def cached(method: Method, dataset_config: str, opts: Sequence[str]) -> int:
        key = (method, dataset_config, tuple(opts))
        if key not in cache:
            cache[key] = function(method, dataset_config, opts)
        return cache[key]

    return cached


def display_path(path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith("..") else relative


def resolve_method(spec: str, default_config: Optional[str], configs_dir,
                   learns: Callable[[str], bool]) -> Method:
    """A Method from ``TRAINER``, ``TRAINER:NAME`` or ``TRAINER:PATH.yaml``.

    ``NAME`` (or ``default_config`` when the spec has no config) is looked up as
    ``configs_dir/trainers/TRAINER/NAME.yaml``; a value ending in .yaml is a path.
    ``learns(trainer)`` says whether the trainer trains (raises for unknown names).

    Raises:
        ConfigError: no config given, or the YAML does not exist.
    """
    trainer, _, config = spec.partition(":")
    trainer, config = trainer.strip(), (config.strip() or default_config)
    if not trainer:
        raise ConfigError(f"Empty trainer name in '{spec}': expected TRAINER or TRAINER:CONFIG.")
    if not config:
        raise ConfigError(
            f"No config for trainer {trainer}: write {trainer}:CONFIG (a name under "
            f"configs/trainers/{trainer}/ or a .yaml path) or give --config for all trainers.")
    is_trainer_learning = learns(trainer)
    if config.endswith((".yaml", ".yml")):
        path = Path(config)
    else:
        path = Path(configs_dir, "trainers", trainer, f"{config}.yaml")
    if not path.is_file():
        folder = Path(configs_dir, "trainers", trainer)
        available = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        raise ConfigError(
            f"Config '{config}' of trainer {trainer} not found (looked for '{path}'). "
            + (f"Configs in {folder}: {', '.join(available)}." if available else
               f"There is no folder {folder}; give a .yaml path (e.g. a CoOp config for a "
               "zero-shot trainer: ZeroshotCLIP:configs/trainers/CoOp/vit_b16.yaml)."))
    return Method(trainer, display_path(path), path.stem, is_trainer_learning)


def dataset_config_file(dataset: str, configs_dir) -> str:
    """``configs_dir/datasets/DATASET.yaml`` (as a display path); ConfigError if missing."""
    path = Path(configs_dir, "datasets", f"{dataset}.yaml")
    if not path.is_file():
        available = sorted(p.stem for p in Path(configs_dir, "datasets").glob("*.yaml"))
        raise ConfigError(f"Dataset '{dataset}' has no config file '{path}'. Dataset configs: "
                          f"{', '.join(available)}.")
    return display_path(path)


def check_opts(opts: Sequence[str], flag: str) -> None:
    """KEY VALUE pairs that leave the protocol's own keys alone; ConfigError otherwise."""
    if len(opts) % 2:
        raise ConfigError(f"{flag} takes KEY VALUE pairs, got an odd number of items: {list(opts)}.")
    owned = [key for key in opts[::2] if key in PROTOCOL_KEYS]
    if owned:
        raise ConfigError(
            f"{flag} sets {', '.join(owned)}, which the protocol sets itself (shots, base/new "
            "classes, output folder, seed, evaluation role); use --shots, --seeds and --output instead.")


def merged_max_epoch(method: Method, dataset_config: str, opts: Sequence[str]) -> int:
    """The epochs the method's trainer trains (``training_epochs``: OPTIM.MAX_EPOCH unless the
    trainer derives it, e.g. per dataset) after merging the dataset YAML, the method YAML and ``opts``.

    Trainer config nodes must be registered (import the ``trainers`` package first).
    Raises ConfigError for a bad file or override, as train.py would.
    """
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, dataset_config)
    merge_from_file(cfg, method.config_file)
    merge_from_list(cfg, list(opts))
    cfg.TRAINER.NAME = method.trainer
    if method.trainer not in TRAINER_REGISTRY.registered_names():
        return int(cfg.OPTIM.MAX_EPOCH)  # train.py names the unknown trainer
    return int(TRAINER_REGISTRY.get(method.trainer).training_epochs(cfg))


class _Builder:
    """Argument lists of one grid (see GridSpec)."""

    def __init__(self, spec: GridSpec):
        self.spec = spec

    def dataset_config(self, dataset: str) -> str:
        return dataset_config_file(dataset, self.spec.configs_dir)

    def label(self, output_dir: Path) -> str:
        return output_dir.relative_to(self.spec.output_root).as_posix()

    def _argv(self, method: Method, dataset: str, seed: int, output_dir: Path, role: str) -> List[str]:
        return ["--root", self.spec.data_root, "--seed", str(seed), "--trainer", method.trainer,
                "--dataset-config-file", self.dataset_config(dataset),
                "--config-file", method.config_file, "--output-dir", str(output_dir),
                "--eval-role", role]

    def train(self, method: Method, dataset: str, seed: int, output_dir: Path,
              keys: Sequence[str], role: str) -> Run:
        """The training run (an --eval-only run for a method that learns nothing); ``role``:
        the evaluation role of its final test."""
        argv = self._argv(method, dataset, seed, output_dir, role)
        if not method.learns:
            return Run(str(output_dir), tuple(argv + ["--eval-only", *keys, *self.spec.opts,
                                                      *self.spec.test_opts]),
                       None, self.label(output_dir))
        return Run(str(output_dir), tuple(argv + [*keys, *self.spec.opts, *self.spec.train_opts]),
                   None, self.label(output_dir))

    def evaluate(self, method: Method, dataset: str, seed: int, output_dir: Path,
                 keys: Sequence[str], trained: Run, train_dataset: str, role: str) -> Run:
        """An --eval-only run loading ``trained``'s last checkpoint (if the method learns)."""
        argv = self._argv(method, dataset, seed, output_dir, role) + ["--eval-only"]
        requires = None
        if method.learns:
            epoch = self.spec.max_epoch(method, self.dataset_config(train_dataset),
                                        [*self.spec.opts, *self.spec.train_opts])
            argv += ["--model-dir", trained.output_dir, "--load-epoch", str(epoch)]
            requires = trained.output_dir
        argv += [*keys, *self.spec.opts, *self.spec.test_opts]
        return Run(str(output_dir), tuple(argv), requires, self.label(output_dir))


def _classes(shots: int, subsample: str) -> List[str]:
    return ["DATASET.NUM_SHOTS", str(shots), "DATASET.SUBSAMPLE_CLASSES", subsample]


def _base2new(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
    root, (shots,) = builder.spec.output_root, datasets.shots
    for dataset in datasets.datasets:
        for seed in builder.spec.seeds:
            train_dir = base2new_run_dir(root, TRAIN_BASE, dataset, shots, method.trainer,
                                         method.cfg, seed)
            trained = builder.train(method, dataset, seed, train_dir, _classes(shots, "base"), "base")
            new_dir = base2new_run_dir(root, TEST_NEW, dataset, shots, method.trainer,
                                       method.cfg, seed)
            tested = builder.evaluate(method, dataset, seed, new_dir, _classes(shots, "new"),
                                      trained, dataset, "new")
            yield Chain((trained, tested))


def _fewshot(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
    root = builder.spec.output_root
    for dataset in datasets.datasets:
        for seed in builder.spec.seeds:
            if not method.learns:
                output_dir = fewshot_run_dir(root, dataset, method.trainer, method.cfg,
                                             ZERO_SHOT_SHOTS, seed)
                yield Chain((builder.train(method, dataset, seed, output_dir, [], "source"),))
                continue
            for shots in datasets.shots:
                output_dir = fewshot_run_dir(root, dataset, method.trainer, method.cfg, shots, seed)
                keys = ["DATASET.NUM_SHOTS", str(shots)]
                yield Chain((builder.train(method, dataset, seed, output_dir, keys, "source"),))


def _transfer(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
    root, (shots,), source = builder.spec.output_root, datasets.shots, datasets.source
    for seed in builder.spec.seeds:
        source_dir = fewshot_run_dir(root, source, method.trainer, method.cfg, shots, seed)
        trained = builder.train(method, source, seed, source_dir, ["DATASET.NUM_SHOTS", str(shots)],
                                "source")
        tests = [builder.evaluate(method, target, seed,
                                  evaluation_run_dir(root, method.trainer, method.cfg, shots,
                                                     target, seed),
                                  [], trained, source, "source" if target == source else "target")
                 for target in datasets.datasets]
        yield Chain((trained, *tests))


_EXPANDERS = {"base2new": _base2new, "fewshot": _fewshot, "cross_dataset": _transfer,
              "dg": _transfer}


def build_grid(spec: GridSpec, protocols: Dict[str, ProtocolDatasets]) -> List[Chain]:
    """The chains of every requested protocol, method by method.

    Chains with the same first run (the cross-dataset and DG protocols share their source
    training, which is also the few-shot run with the same shots) are merged, so no run
    appears twice.

    Raises:
        ConfigError: unknown protocol, missing dataset YAML, or a config that does not merge.
    """
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown:
        raise ConfigError(f"Unknown protocol(s) {sorted(unknown)}; choose from {', '.join(PROTOCOLS)}.")
    builder = _Builder(spec)
    merged: Dict[str, List[Run]] = {}
    for method in spec.methods:
        for name, datasets in protocols.items():
            for chain in _EXPANDERS[name](builder, method, datasets):
                runs = merged.setdefault(chain.head, [])
                known = {run.output_dir for run in runs}
                runs.extend(run for run in chain.runs if run.output_dir not in known)
    return [Chain(tuple(runs)) for runs in merged.values()]
