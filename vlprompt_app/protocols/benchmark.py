"""Benchmarks: which datasets, shots and seeds each protocol uses (``configs/benchmarks/*.yaml``).

A benchmark file names datasets by their YAML stem under ``configs/datasets/``::

    seeds: [1, 2, 3]
    base2new:      {datasets: [imagenet, caltech101, ...], shots: 16}
    fewshot:       {datasets: [imagenet, caltech101, ...], shots: [1, 2, 4, 8, 16]}
    cross_dataset: {source: imagenet, targets: [caltech101, ...], shots: 16}
    dg:            {source: imagenet, targets: [imagenetv2, ...], shots: 16}
    fft:           {source: imagenet, targets: [imagenetv2, ..., objectnet], shots: 0}
    ttt:           {source: imagenet, targets: [imagenetv2, ...], shots: 16}

Every protocol section is optional; a protocol a benchmark lacks cannot be run with it.
``fft`` is RAda's full fine-tuning (Table 1): train on the whole source dataset (shots 0 =
every training image), evaluate in distribution (the source test set) and on the OOD targets.
``ttt`` is RAda's test-time setting (Table 3): a method adapted per test image on each
target; ``source`` and ``shots`` say where an optional source model is trained.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import yaml

__all__ = ["PROTOCOLS", "TRANSFER", "BenchmarkError", "ProtocolDatasets", "Benchmark", "load_benchmark",
           "benchmark_path", "dataset_config_names"]

PROTOCOLS = ("base2new", "fewshot", "cross_dataset", "dg", "fft", "ttt")
"""Protocol names (the CoOp family's four; fft and ttt: RAda's Tables 1 and 3)."""

TRANSFER = ("cross_dataset", "dg", "fft", "ttt")
"""Protocols with a source dataset and target datasets."""



class BenchmarkError(ValueError):
    """A benchmark file that is missing or malformed."""


@dataclass(frozen=True)
class ProtocolDatasets:
    """Datasets of one protocol.

    Attributes:
        datasets: base2new/fewshot: the datasets; cross_dataset/dg/fft/ttt: the target datasets.
        shots: shot counts (one except for fewshot; 0 = every training image).
        source: the training dataset of cross_dataset/dg/fft (ttt: of the source model), else None.
    """

    datasets: Tuple[str, ...]
    shots: Tuple[int, ...]
    source: Optional[str] = None


@dataclass(frozen=True)
class Benchmark:
    """A named set of protocol definitions (see module docstring)."""

    name: str
    seeds: Tuple[int, ...]
    protocols: Dict[str, ProtocolDatasets]

    def dataset_stems(self) -> Tuple[str, ...]:
        """Every dataset the benchmark names, in order of first appearance (protocols in PROTOCOLS
        order; a source before its targets); e.g. the paper benchmark's 16."""
        stems = []
        for name in PROTOCOLS:
            if name in self.protocols:
                section = self.protocols[name]
                stems += ([section.source] if section.source else []) + list(section.datasets)
        return tuple(dict.fromkeys(stems))

    def protocol(self, name: str) -> ProtocolDatasets:
        """The definition of protocol ``name``; BenchmarkError when the benchmark lacks it."""
        if name not in self.protocols:
            raise BenchmarkError(
                f"Benchmark '{self.name}' does not define the protocol '{name}' (it defines: "
                f"{', '.join(self.protocols) or 'none'}); give the datasets on the command line "
                "or add a section to the benchmark file.")
        return self.protocols[name]


def benchmark_path(name_or_path: str, configs_dir) -> Path:
    """``configs_dir/benchmarks/NAME.yaml`` for a bare name, else the path itself."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or len(candidate.parts) > 1:
        return candidate
    return Path(configs_dir, "benchmarks", f"{name_or_path}.yaml")


def _fail(path: Path, message: str) -> BenchmarkError:
    return BenchmarkError(f"Benchmark file '{path}': {message}")


def _names(path: Path, where: str, value) -> Tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"{where} must be a non-empty list of dataset YAML stems "
                          f"(e.g. [imagenet, dtd]), got {value!r}.")
    return tuple(value)


def _ints(path: Path, where: str, value, single: bool) -> Tuple[int, ...]:
    values = [value] if single else value
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)):
        kind = "a non-negative integer" if single else "a non-empty list of non-negative integers"
        raise _fail(path, f"{where} must be {kind}, got {value!r}.")
    return tuple(values)


def _protocol(path: Path, name: str, section) -> ProtocolDatasets:
    transfer = name in TRANSFER
    expected = {"source", "targets", "shots"} if transfer else {"datasets", "shots"}
    if not isinstance(section, dict) or set(section) != expected:
        raise _fail(path, f"section '{name}' must have exactly the keys {sorted(expected)}, "
                          f"got {sorted(section) if isinstance(section, dict) else section!r}.")
    single_shot = name != "fewshot"
    shots = _ints(path, f"{name}.shots", section["shots"], single=single_shot)
    if transfer:
        source = section["source"]
        if not isinstance(source, str) or not source:
            raise _fail(path, f"{name}.source must be a dataset YAML stem, got {source!r}.")
        return ProtocolDatasets(_names(path, f"{name}.targets", section["targets"]), shots, source)
    return ProtocolDatasets(_names(path, f"{name}.datasets", section["datasets"]), shots)


def load_benchmark(name_or_path: str, configs_dir) -> Benchmark:
    """Read and validate a benchmark file (a name under ``configs_dir/benchmarks`` or a path).

    Raises:
        BenchmarkError: missing file, unknown section, or malformed values (one clear message).
    """
    path = benchmark_path(name_or_path, configs_dir)
    if not path.is_file():
        available = sorted(p.stem for p in Path(configs_dir, "benchmarks").glob("*.yaml"))
        raise BenchmarkError(f"Benchmark file '{path}' does not exist; give a name from "
                             f"{available} or the path of a YAML file.")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise _fail(path, f"not valid YAML ({exc}).") from None
    if not isinstance(content, dict):
        raise _fail(path, "expected a mapping with 'seeds' and protocol sections.")
    unknown = set(content) - {"seeds", *PROTOCOLS}
    if unknown:
        raise _fail(path, f"unknown section(s) {sorted(unknown)}; allowed: seeds, "
                          f"{', '.join(PROTOCOLS)}.")
    seeds = _ints(path, "seeds", content.get("seeds"), single=False)
    protocols = {name: _protocol(path, name, content[name]) for name in PROTOCOLS if name in content}
    return Benchmark(path.stem, seeds, protocols)


def dataset_config_names(configs_dir) -> Dict[str, str]:
    """YAML stem -> DATASET.NAME of the dataset configs ``configs_dir/datasets/*.yaml`` (sorted by stem),
    the names a benchmark file's stems stand for."""
    names = {}
    for path in sorted(Path(configs_dir, "datasets").glob("*.yaml")):
        names[path.stem] = yaml.safe_load(path.read_text(encoding="utf-8"))["DATASET"]["NAME"]
    return names
