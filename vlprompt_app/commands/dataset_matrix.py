"""Print every dataset's own facts and the method x dataset matrix of per-dataset values.

    python tools/dataset_matrix.py                                  # every method with a table, every dataset
    python tools/dataset_matrix.py --methods MMRL TCP --datasets imagenet EuroSAT imagenet_a
    python tools/dataset_matrix.py --json matrix.json               # also write it all as JSON

Datasets: every dataset class that datasets/ registers, those of the benchmark files first
(configs/benchmarks/*.yaml, by file name, each in its order), then the others by name. Their
own facts are class attributes (vlprompt.data.datasets.DatasetBase): the zero-shot template,
the stem of the class-description file (TAC) and the published split sizes; the YAML stem
under configs/datasets/ and the benchmarks that name the dataset come from the config files.

Methods: the trainers of trainers/ whose file declares per-dataset tables as DatasetRules
(vlprompt.engine.option_rules) at module level. Each rule is resolved for each dataset the way
a run with the method's default config does (the key's default value, ``auto`` today; a rule
that no option sets is looked up; a fallback takes the dataset class's own attribute): a cell
is the value or the refusal, a ConfigError whose message says why and what to set. A rule read
in some evaluation scopes only is named with them (MMRL++'s two beta tables). A config file
that sets a key explicitly wins over the table, as on the command line.

The first table lists the datasets' facts, the second one cell per dataset and method ("ok"
or the number of refused rules), then each method's values with its refusals below them.
Exit status 2 for an unknown method or dataset.
"""
import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tabulate import tabulate

from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.eval_scope import EVAL_SCOPES
from vlprompt.engine.option_rules import AUTO, DatasetRule
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project
from vlprompt_app.protocols.benchmark import dataset_config_names, load_benchmark

CONFIGS = repository_root() / "configs"
SPLITS = ("train", "val", "test")


class MatrixError(ValueError):
    """A method or dataset asked for that is not registered."""


@dataclass(frozen=True)
class DatasetFacts:
    """What one registered dataset says of itself, and where the config files name it.

    Attributes:
        name: DATASET.NAME. config_stems: the YAML stems under configs/datasets/ that select it.
        template: its zero-shot sentence. description_stem: ``<stem>_prompt.json`` ("" when none).
        published_sizes: (train, val, test) of the published split, or None.
        benchmarks: the benchmark files (stems) that name it.
    """

    name: str
    config_stems: Tuple[str, ...]
    template: str
    description_stem: str
    published_sizes: Optional[Tuple[Optional[int], ...]]
    benchmarks: Tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One rule of one method on one dataset: the value, or the refusal's message."""

    value: Any = None
    refusal: str = ""

    @property
    def refused(self) -> bool:
        return bool(self.refusal)


def project_datasets() -> List[str]:
    """The dataset names datasets/ registers: those of the benchmark files first (by file name, each
    in its order of first appearance), then the others by name."""
    import_project()
    names = [name for name in DATASET_REGISTRY.registered_names()
             if DATASET_REGISTRY.get(name).__module__.split(".")[0] == "datasets"]
    named = [config_names()[stem] for stems in benchmark_stems().values() for stem in stems]
    ordered = [name for name in dict.fromkeys(named) if name in names]
    return ordered + sorted(set(names) - set(ordered))


@functools.lru_cache(maxsize=None)
def benchmark_stems() -> Dict[str, Tuple[str, ...]]:
    """Benchmark file stem (configs/benchmarks/*.yaml, sorted) -> the dataset stems it names."""
    paths = sorted(Path(CONFIGS, "benchmarks").glob("*.yaml"))
    return {path.stem: load_benchmark(path.stem, CONFIGS).dataset_stems() for path in paths}


@functools.lru_cache(maxsize=None)
def config_names() -> Dict[str, str]:
    """YAML stem -> DATASET.NAME of configs/datasets/ (read once)."""
    return dataset_config_names(CONFIGS)


def dataset_facts(name: str) -> DatasetFacts:
    """The facts of the registered dataset ``name``."""
    cls = DATASET_REGISTRY.get(name)
    stems = tuple(stem for stem, config_name in config_names().items() if config_name == name)
    benchmarks = tuple(benchmark for benchmark, named in benchmark_stems().items() if set(stems) & set(named))
    sizes = cls.published_sizes
    return DatasetFacts(name, stems, cls.template, cls.description_stem, tuple(sizes) if sizes else None, benchmarks)


def declared_rules(module: ModuleType) -> Tuple[DatasetRule, ...]:
    """The DatasetRules a module holds at module level, directly or as the values of a dict, list or
    tuple, in the order of its names (each once)."""
    found = []
    for value in vars(module).values():
        members = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        found += [member for member in members if isinstance(member, DatasetRule)]
    return tuple({id(rule): rule for rule in found}.values())


def method_rules() -> Dict[str, Tuple[DatasetRule, ...]]:
    """Trainer name -> the DatasetRules of its file, for every trainer of trainers/ (sorted by name)."""
    import_project()
    modules = {name: TRAINER_REGISTRY.get(name).__module__ for name in TRAINER_REGISTRY.registered_names()}
    return {name: declared_rules(sys.modules[modules[name]])
            for name in sorted(modules) if modules[name].split(".")[0] == "trainers"}


def rule_label(rule: DatasetRule) -> str:
    """The rule's key, with the evaluation scopes that read it when not all do."""
    return rule.key if rule.scopes == EVAL_SCOPES else f"{rule.key} [{', '.join(rule.scopes)}]"


@functools.lru_cache(maxsize=None)
def _default_cfg():
    import_project()  # registers every trainer's config extension
    cfg = get_cfg_default()
    extend_cfg(cfg)
    return cfg


def default_value(rule: DatasetRule):
    """The value a run with the default config gives the rule: its key's default, or ``auto`` for a
    rule that no option sets.

    Raises:
        ValueError: the rule names a config key that the default config does not have.
    """
    if not rule.option:
        return AUTO
    node = _default_cfg()
    for part in rule.key.split("."):
        if part not in node:
            raise ValueError(f"DatasetRule {rule.key}: the default config has no such key (declare the rule "
                             "with option=False if no config option sets it).")
        node = node[part]
    return node


def resolve_cell(rule: DatasetRule, dataset: str) -> Cell:
    """``rule`` resolved for ``dataset`` with its default value (:func:`default_value`)."""
    own = getattr(DATASET_REGISTRY.get(dataset), rule.fallback) if rule.fallback else None
    try:
        return Cell(rule.resolve(default_value(rule), dataset, own=own))
    except ConfigError as refusal:
        return Cell(refusal=str(refusal))


def build_matrix(methods: Sequence[str], datasets: Sequence[str]) -> Dict[str, Dict[str, Dict[str, Cell]]]:
    """method -> dataset -> rule label -> Cell, for the methods that declare rules."""
    rules = method_rules()
    return {method: {dataset: {rule_label(rule): resolve_cell(rule, dataset) for rule in rules[method]}
                     for dataset in datasets}
            for method in methods if rules[method]}


def _choose(requested, available, kind, aliases=None):
    """The available names for ``requested`` (case-insensitive; ``aliases`` maps other keys, e.g.
    YAML stems, to names), in the given order; MatrixError names the unknown ones."""
    by_key = {name.lower(): name for name in available}
    by_key.update({key.lower(): name for key, name in (aliases or {}).items() if name in available})
    unknown = [name for name in requested if name.lower() not in by_key]
    if unknown:
        raise MatrixError(f"Unknown {kind} {unknown}: expected some of {', '.join(available)}"
                          + (" or a YAML stem of configs/datasets/." if aliases else "."))
    return list(dict.fromkeys(by_key[name.lower()] for name in requested))


def _sizes_text(sizes):
    if sizes is None:
        return ""
    return ", ".join(f"{split} {n:,}" for split, n in zip(SPLITS, sizes) if n is not None)


def facts_table(facts: Sequence[DatasetFacts]) -> str:
    rows = [(f.name, ", ".join(f.config_stems), f.template, f.description_stem, _sizes_text(f.published_sizes),
             ", ".join(f.benchmarks)) for f in facts]
    return tabulate(rows, headers=("dataset", "config", "template", "descriptions", "published split", "benchmarks"))


def summary_table(matrix, datasets) -> str:
    def cell(cells):
        refused = sum(c.refused for c in cells.values())
        return f"refuses {refused}" if refused else "ok"

    rows = [(dataset, *(cell(matrix[method][dataset]) for method in matrix)) for dataset in datasets]
    return tabulate(rows, headers=("dataset", *matrix))


def _shown(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def method_report(method, by_dataset) -> str:
    """The method's values per dataset (rows) and rule (columns), then its refusals, each rule's
    datasets listed with the message of the first."""
    labels = list(next(iter(by_dataset.values())))
    rows = [(dataset, *("refused" if c.refused else _shown(c.value) for c in cells.values()))
            for dataset, cells in by_dataset.items()]
    lines = [f"{method}", tabulate(rows, headers=("dataset", *labels))]
    for label in labels:
        refused = [dataset for dataset, cells in by_dataset.items() if cells[label].refused]
        if refused:
            first = by_dataset[refused[0]][label].refusal
            lines.append(f"  {label} refuses {len(refused)}: {', '.join(refused)}\n    for {refused[0]}: {first}")
    return "\n".join(lines)


def to_json(facts, matrix, without) -> dict:
    """Everything printed, as JSON: datasets' facts, each method's cells, the methods without tables."""
    return {
        "datasets": {f.name: {"config_stems": list(f.config_stems), "template": f.template,
                              "description_stem": f.description_stem,
                              "published_sizes": list(f.published_sizes) if f.published_sizes else None,
                              "benchmarks": list(f.benchmarks)} for f in facts},
        "methods": {method: {dataset: {label: ({"refusal": c.refusal} if c.refused else {"value": c.value})
                                       for label, c in cells.items()}
                             for dataset, cells in by_dataset.items()}
                    for method, by_dataset in matrix.items()},
        "methods_without_tables": without,
    }


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", metavar="TRAINER",
                        help="trainers to list (default: every trainer of trainers/)")
    parser.add_argument("--datasets", nargs="+", metavar="NAME",
                        help="registered names or YAML stems of configs/datasets/ (default: every dataset of datasets/)")
    parser.add_argument("--json", metavar="PATH", help="also write the facts and the matrix to PATH as JSON")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        print(f"dataset_matrix: --json {args.json}: its folder does not exist; give a path in an existing folder.",
              file=sys.stderr)
        return 2
    rules = method_rules()
    try:
        methods = _choose(args.methods, list(rules), "method(s)") if args.methods else list(rules)
        available = project_datasets()
        datasets = (_choose(args.datasets, available, "dataset(s)", config_names())
                    if args.datasets else available)
    except MatrixError as error:
        print(f"dataset_matrix: {error}", file=sys.stderr)
        return 2
    facts = [dataset_facts(name) for name in datasets]
    matrix = build_matrix(methods, datasets)
    without = [method for method in methods if not rules[method]]
    print(f"Datasets ({len(datasets)}): their own facts\n")
    print(facts_table(facts))
    if matrix:
        print(f"\nPer-dataset values of {len(matrix)} method(s), resolved as with the default config: "
              "ok, or how many of the method's rules refuse the dataset\n")
        print(summary_table(matrix, datasets))
        for method, by_dataset in matrix.items():
            print("\n" + method_report(method, by_dataset))
    if without:
        print(f"\nNo per-dataset table (no DatasetRule in their files): {', '.join(without)}")
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(facts, matrix, without), indent=1) + "\n", encoding="utf-8")
        print(f"\nWrote {args.json}")
    return 0
