"""Every method and config that the documentation names exists.

* Each ``--trainers`` list of a command in README.md, DATASETS.md, PERFORMANCE.md, docs/*.md, the
  docstrings and other texts of train.py and the Python sources, and configs/*.yaml resolves the way the command's tool resolves it:
  run_protocol.py (also called through ``$RUN``) with ``vlprompt_app.protocols.grid.resolve_methods`` (every stage of a staged TRAINER:CFG1@E:CFG2)
  (``NAME:cfg`` -> configs/trainers/NAME/cfg.yaml, a bare NAME takes the command's
  ``--config``, a value ending in .yaml is a path); parse_results.py / plot_results.py need a
  registered trainer and, with ``:CFG``, an existing config; benchmark.py needs one of its
  trainer cases (vlprompt_app.benchmarking.trainer_cases).
  A shell loop variable (``for K in 1 2; do ... ${K}shot``) is expanded.
* Every ``configs/...yaml`` path mentioned there exists, except files the README tells the
  reader to create and paths with a placeholder name (``configs/trainers/TRAINER/...``, ``configs/published/PROTOCOL.yaml``).
"""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN = ("README.md", "DATASETS.md", "PERFORMANCE.md") + tuple(
    f"docs/{path.name}" for path in sorted((ROOT / "docs").glob("*.md")))
TOOLS = {
    "run_protocol": re.compile(r"run_protocol\.py|\$RUN\b"),
    "results": re.compile(r"(parse|plot)_results\.py"),
    "benchmark": re.compile(r"tools/benchmark\.py"),
}
# Not preceded by a path component: "eft/configs/..." names a file of another repository
# (an official implementation cited as a source).
CONFIG_PATH = re.compile(r"(?<![\w./-])configs/[\w./+-]+\.ya?ml")
# Files the documentation tells the reader to create (README: "add configs/datasets/my_data.yaml").
TO_BE_CREATED = {"configs/datasets/my_data.yaml"}


SOURCES = ("tools", "vlprompt", "trainers", "datasets", "vlprompt_app")
# Placeholder names in documented paths, e.g. configs/trainers/TRAINER/synthetic.yaml.
PLACEHOLDERS = {"TRAINER", "NAME", "PROTOCOL", "DATASET", "METHOD", "BENCHMARK"}


@functools.lru_cache(maxsize=None)
def documents():
    """(name, text) of the Markdown files, of the string constants (docstrings, help and error
    texts) of train.py and the Python sources, and of the YAML files under configs/ (read once per
    process, by the first test that needs them: not at collection, which every xdist worker repeats)."""
    docs = [(name, (ROOT / name).read_text(encoding="utf-8")) for name in MARKDOWN]
    python = [ROOT / "train.py"] + [path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*.py"))]
    for path in python:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        docs.append((path.relative_to(ROOT).as_posix(), "\n".join(strings)))
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        docs.append((path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")))
    return tuple(docs)


# The tests run once per group of documents (each lists every failure of its group).
GROUPS = ("markdown", "train.py") + SOURCES + ("configs",)


def group_of(document):
    """The GROUPS entry of a document name."""
    if document in MARKDOWN:
        return "markdown"
    return document.split("/")[0]


def _expand_loops(line, token):
    """``token`` with the variables of a ``for V in a b c; do`` on ``line`` expanded."""
    tokens = [token]
    for var, values in re.findall(r"for (\w+) in ([^;]+);", line):
        tokens = [t.replace("${%s}" % var, v).replace("$" + var, v) for t in tokens for v in values.split()]
    return tokens


def trainer_lists():
    """(document, tool, specs, --config default) of every documented ``--trainers`` list."""
    found = []
    for name, text in documents():
        joined = re.sub(r"\\\n\s*", " ", text)
        for match in re.finditer(r"--trainers[ \t]+([^\n`]*)", joined):
            before = joined[: match.start()]
            tools = [(m.end(), tool) for tool, pattern in TOOLS.items() for m in pattern.finditer(before)]
            assert tools, f"{name}: cannot tell which tool takes '--trainers {match.group(1)}'"
            tool = max(tools)[1]
            line = joined[joined.rfind("\n", 0, match.start()) + 1: joined.find("\n", match.end())]
            specs = []
            for token in re.split(r"[\s,]+", match.group(1).strip()):
                token = token.strip("[]")
                if not token or token.startswith("-") or token.startswith(";"):
                    break
                specs.extend(_expand_loops(line, token.rstrip(";")))
                if token.endswith(";"):
                    break
            config = re.search(r"--config\s+(\S+)", match.group(0))
            found.append((name, tool, specs, config.group(1) if config else None))
    return found


def test_the_scan_finds_the_documented_lists():
    lists = trainer_lists()
    names = {name for name, _, _, _ in lists}
    assert {"README.md", "vlprompt_app/commands/run_protocol.py"} <= names
    all_specs = [spec for _, _, specs, _ in lists for spec in specs]
    assert "DeAR:vit_b16_fewshot_16shot" in all_specs and "DeAR:vit_b16_fewshot_1shot" in all_specs


def test_every_document_is_in_a_group():
    assert {group_of(name) for name, _ in documents()} == set(GROUPS)


def _resolve(tool, spec, config):
    """Resolve one ``--trainers`` spec the way ``tool`` does (raises if it does not resolve)."""
    from vlprompt_app.commands import run_protocol
    from vlprompt_app.protocols.grid import resolve_methods

    trainer, _, cfg = spec.partition(":")
    if tool == "run_protocol":
        resolve_methods(spec, config, ROOT / "configs", run_protocol._trainer_learns)  # every stage
    elif tool == "results":
        run_protocol._trainer_learns(trainer)
        if cfg:
            path = Path(cfg) if cfg.endswith(".yaml") else ROOT / "configs" / "trainers" / trainer / f"{cfg}.yaml"
            assert path.is_file(), f"{spec} names a config that does not exist ({path})"
    else:
        from vlprompt_app.benchmarking.trainer_cases import select_cases

        select_cases([spec])


@pytest.mark.parametrize("group", GROUPS)
def test_documented_trainers_resolve(group, monkeypatch):
    monkeypatch.chdir(ROOT)
    import trainers  # noqa: F401  (registers the trainers, as run_protocol.py does)

    failures = []
    for document, tool, specs, config in trainer_lists():
        if group_of(document) != group:
            continue
        if not specs:
            failures.append(f"{document}: an empty --trainers list")
        for spec in specs:
            try:
                _resolve(tool, spec, config)
            except (Exception, SystemExit) as error:  # every failing spec of the group is listed
                failures.append(f"{document} ({tool}, --config {config}): {spec}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("group", GROUPS)
def test_documented_config_paths_exist(group):
    missing = {}
    for document, text in documents():
        if group_of(document) != group:
            continue
        paths = sorted({path for path in CONFIG_PATH.findall(text)
                        if not (ROOT / path).is_file() and path not in TO_BE_CREATED
                        and not PLACEHOLDERS & set(Path(path).with_suffix("").parts)})
        if paths:
            missing[document] = paths
    assert not missing, "\n".join(f"{document} names config files that do not exist: {paths}"
                                   for document, paths in missing.items())
