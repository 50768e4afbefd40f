"""Expand a protocol over methods x datasets x seeds into ``train.py`` runs.

Each protocol's phases (as the CoOp-family scripts run them):

* ``base2new``: train on the base classes (``train_base``, the final test there is the Base
  accuracy), then evaluate the same checkpoint on the new classes (``test_new``).
* ``fewshot``: one training run per shot count on all classes.
* ``cross_dataset`` / ``dg`` / ``fft``: train once on the source dataset, then evaluate that
  checkpoint on every target dataset with ``--eval-only`` (``fft``: shots 0, the whole
  training set; the training run's final test is the in-distribution accuracy).
* ``ttt``: evaluate the method (a test-time method: it adapts per test image inside
  ``--eval-only``) on every target; with ``GridSpec.source_model`` it first trains that model
  on the source dataset and every target run loads it (``--model-dir``).

A *staged* method (``TRAINER:CFG1@E:CFG2``, :func:`resolve_methods`) is one Method per stage:
stage 2 trains with ``MODEL.INIT_WEIGHTS`` = stage 1's checkpoint of epoch E (default: its
last), ``RUN/TRAINER/model.pth.tar-E`` (the model registered under the trainer's name, as
RAdaFFT does), in its own folder; both stages are evaluated on the targets, in one chain.
Staged methods are supported by the transfer protocols (cross_dataset, dg, fft).

A method that learns nothing (a trainer class with ``learns = False``, e.g. ZeroshotCLIP)
is evaluated with ``--eval-only`` and no ``--model-dir`` in every phase; in the few-shot
protocol it is evaluated once (shot count 0, see :mod:`vlprompt_app.protocols.layout`).

Every run gets its evaluation scope explicitly (``--eval-role``, see
:mod:`vlprompt.engine.eval_scope`): ``base`` for the base-to-novel training run, ``new`` for its
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
from vlprompt.engine.run_folder import RunFolder

from .benchmark import PROTOCOLS, ProtocolDatasets
from .layout import (
    TEST_NEW, TRAIN_BASE, base2new_run_dir, evaluation_run_dir, fewshot_run_dir, source_model_name, ttt_run_dir,
)

__all__ = [
    "PROTOCOL_KEYS", "Method", "StageInit", "Run", "Chain", "GridSpec", "resolve_method", "resolve_methods",
    "dataset_config_file",
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
        init: for a later stage of a staged method, the stage whose checkpoint it starts from.
    """

    trainer: str
    config_file: str
    cfg: str
    learns: bool = True
    init: Optional["StageInit"] = None

    @property
    def label(self) -> str:
        return f"{self.trainer}:{self.cfg}"


@dataclass(frozen=True)
class StageInit:
    """Where a later stage starts: ``previous``'s checkpoint of ``epoch`` (None: its last)."""

    previous: Method
    epoch: Optional[int] = None


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
        source_model: ttt only: the method trained on the source dataset that every
            test-time run starts from (None: the test-time method starts from CLIP).
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
    source_model: Optional[Method] = None

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


def resolve_methods(spec: str, default_config: Optional[str], configs_dir,
                    learns: Callable[[str], bool]) -> List[Method]:
    """The Methods of ``TRAINER``, ``TRAINER:CONFIG`` or a staged ``TRAINER:CFG1[@E]:CFG2...``.

    Each stage is resolved as by :func:`resolve_method`; stage k+1 gets
    ``StageInit(stage k, E)`` (E: the epoch of stage k's checkpoint it starts from, default
    stage k's last).

    Raises:
        ConfigError: an unknown config, a bad ``@E``, ``@E`` on the last stage, or stages of
            a trainer that learns nothing.
    """
    trainer, _, configs = spec.partition(":")
    stages = configs.split(":") if configs else [""]
    methods: List[Method] = []
    init = None
    for position, stage in enumerate(stages):
        config, at, epoch_text = stage.partition("@")
        epoch = None
        if at:
            if position == len(stages) - 1:
                raise ConfigError(f"'{spec}': @EPOCH names the checkpoint of a stage that the next stage "
                                  f"starts from (TRAINER:CFG1@EPOCH:CFG2); the last stage has none.")
            if not epoch_text.isdigit() or int(epoch_text) < 1:
                raise ConfigError(f"'{spec}': @EPOCH must be a positive epoch number, got '@{epoch_text}'.")
            epoch = int(epoch_text)
        method = resolve_method(f"{trainer}:{config}" if config else trainer, default_config, configs_dir, learns)
        if len(stages) > 1 and not method.learns:
            raise ConfigError(f"'{spec}': trainer {method.trainer} learns nothing, so it cannot have stages.")
        method = Method(method.trainer, method.config_file, method.cfg, method.learns, init)
        methods.append(method)
        init = StageInit(method, epoch)
    return methods


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
            "classes, output folder, seed, evaluation scope); use --shots, --seeds and --output instead.")


def merged_max_epoch(method: Method, dataset_config: str, opts: Sequence[str]) -> int:
    """The epochs the method's trainer trains (``training_epochs``: OPTIM.MAX_EPOCH unless the
    trainer derives it, e.g. per dataset) after merging the dataset YAML, the method YAML and ``opts``.

    Trainer config nodes must be registered (import the ``trainers`` package first).
    Raises ConfigError for a bad file or override, as train.py would.
    """
    from vlprompt.engine import TRAINER_REGISTRY  # here: a Slurm job unpickling a chain needs no torch

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
        the evaluation scope of its final test."""
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


def _no_stages(name: str, method: Method) -> None:
    if method.init is not None:
        raise ConfigError(f"Protocol {name} does not run staged methods ({method.label} starts from "
                          f"{method.init.previous.label}); use cross_dataset, dg or fft.")


def _transfer(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
    root, (shots,), source = builder.spec.output_root, datasets.shots, datasets.source
    for seed in builder.spec.seeds:
        source_dir = fewshot_run_dir(root, source, method.trainer, method.cfg, shots, seed)
        keys = ["DATASET.NUM_SHOTS", str(shots)]
        previous_dir = None
        if method.init is not None:
            previous = method.init.previous
            previous_dir = fewshot_run_dir(root, source, previous.trainer, previous.cfg, shots, seed)
            epoch = method.init.epoch or builder.spec.max_epoch(
                previous, builder.dataset_config(source), [*builder.spec.opts, *builder.spec.train_opts])
            keys += ["MODEL.INIT_WEIGHTS", str(RunFolder(previous_dir).checkpoint_path(previous.trainer, epoch))]
        trained = builder.train(method, source, seed, source_dir, keys, "source")
        if previous_dir is not None:
            trained = Run(trained.output_dir, trained.argv, str(previous_dir), trained.label)
        tests = [builder.evaluate(method, target, seed,
                                  evaluation_run_dir(root, method.trainer, method.cfg, shots,
                                                     target, seed),
                                  [], trained, source, "source" if target == source else "target")
                 for target in datasets.datasets]
        yield Chain((trained, *tests))


def _ttt(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
    """Per seed: the source model's training (with ``GridSpec.source_model``), then the
    method's --eval-only run on every target (loading the source model's last epoch)."""
    _no_stages("ttt", method)
    spec = builder.spec
    root, (shots,), source, model = spec.output_root, datasets.shots, datasets.source, spec.source_model
    if model is not None and (not model.learns or model.init is not None):
        raise ConfigError(f"The ttt source model {model.label} must be a one-stage method that trains.")
    name = source_model_name(model.trainer, model.cfg, shots) if model else source_model_name()
    for seed in spec.seeds:
        runs: List[Run] = []
        load: List[str] = []
        if model is not None:
            source_dir = fewshot_run_dir(root, source, model.trainer, model.cfg, shots, seed)
            runs.append(builder.train(model, source, seed, source_dir, ["DATASET.NUM_SHOTS", str(shots)], "source"))
            epoch = spec.max_epoch(model, builder.dataset_config(source), [*spec.opts, *spec.train_opts])
            load = ["--model-dir", str(source_dir), "--load-epoch", str(epoch)]
        for target in datasets.datasets:
            output_dir = ttt_run_dir(root, method.trainer, method.cfg, name, target, seed)
            argv = [*builder._argv(method, target, seed, output_dir, "target"), "--eval-only", *load,
                    *spec.opts, *spec.test_opts]
            runs.append(Run(str(output_dir), tuple(argv), runs[0].output_dir if model else None,
                            builder.label(output_dir)))
        yield Chain(tuple(runs))


def _one_stage(name: str, expander):
    def expand(builder: _Builder, method: Method, datasets: ProtocolDatasets) -> Iterable[Chain]:
        _no_stages(name, method)
        return expander(builder, method, datasets)
    return expand


_EXPANDERS = {"base2new": _one_stage("base2new", _base2new), "fewshot": _one_stage("fewshot", _fewshot),
              "cross_dataset": _transfer, "dg": _transfer, "fft": _transfer, "ttt": _ttt}


def build_grid(spec: GridSpec, protocols: Dict[str, ProtocolDatasets]) -> List[Chain]:
    """The chains of every requested protocol, method by method.

    Chains with the same first run (the cross-dataset and DG protocols share their source
    training, which is also the few-shot run with the same shots) are merged, so no run
    appears twice; a chain whose first run needs a run of an earlier chain (a later stage
    of a staged method) is appended to that chain.

    Raises:
        ConfigError: unknown protocol, missing dataset YAML, or a config that does not merge.
    """
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown:
        raise ConfigError(f"Unknown protocol(s) {sorted(unknown)}; choose from {', '.join(PROTOCOLS)}.")
    builder = _Builder(spec)
    merged: Dict[str, List[Run]] = {}
    home: Dict[str, str] = {}  # output folder -> head of the chain holding it
    for method in spec.methods:
        for name, datasets in protocols.items():
            for chain in _EXPANDERS[name](builder, method, datasets):
                first = chain.runs[0]
                head = home.get(chain.head) or home.get(first.requires) or chain.head
                runs = merged.setdefault(head, [])
                for run in chain.runs:
                    if run.output_dir not in home:
                        runs.append(run)
                        home[run.output_dir] = head
    return [Chain(tuple(runs)) for runs in merged.values()]
