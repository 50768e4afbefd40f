"""The import graph of the project's own code: no module imports a layer above its own, and
no two modules import each other, directly or through others.

Layers, from the bottom: ``vlprompt`` (the library); ``trainers`` and ``datasets`` (methods
and datasets, on the library); ``vlprompt_app`` (the application, above them); the command
lines ``train.py`` and ``tools/*.py`` on top. Every import statement counts, also one inside
a function, since it runs whenever that function does.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"vlprompt": 0, "trainers": 1, "datasets": 1, "vlprompt_app": 2, "tools": 3, "train": 3}
PACKAGES = ("vlprompt", "trainers", "datasets", "vlprompt_app")


def module_name(path: Path) -> str:
    """``vlprompt/engine/trainer.py`` -> ``vlprompt.engine.trainer``; a package's ``__init__.py``
    is the package; ``tools/x.py`` is ``tools.x``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files():
    files = [ROOT / "train.py", *sorted((ROOT / "tools").glob("*.py"))]
    for package in PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").is_file()


def resolve(name: str, modules) -> str:
    """The project module an imported dotted name refers to: the longest prefix that is one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return ""


def imported_names(source: str, name: str):
    """Absolute dotted names imported by the source of module ``name`` (``from a import b``
    gives ``a.b``, which resolves to module ``a.b`` if there is one, else to ``a``)."""
    tree = ast.parse(source)
    package = name if is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                yield f"{module}.{alias.name}"


def import_graph():
    """{module: set of project modules it imports}."""
    files = {module_name(path): path for path in project_files()}
    graph = {}
    for name, path in files.items():
        targets = {resolve(imported, files) for imported in imported_names(path.read_text(encoding="utf-8"), name)}
        graph[name] = {target for target in targets if target and target != name}
    return graph


def layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def upward_imports(graph):
    return sorted(f"{source} imports {target}" for source, targets in graph.items()
                  for target in targets if layer(target) > layer(source))


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph()) == []


def test_the_project_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_checks_catch_an_upward_import_and_a_cycle():
    graph = {"vlprompt.a": {"trainers.coop"}, "trainers.coop": {"vlprompt.a"}, "tools.x": {"vlprompt_app.y"},
             "vlprompt_app.y": set()}
    assert upward_imports(graph) == ["vlprompt.a imports trainers.coop"]
    assert cycles(graph) == [["trainers.coop", "vlprompt.a"]]


@pytest.mark.parametrize("source, expected", [
    ("from vlprompt.engine.results import write_results", {"vlprompt.engine.results.write_results"}),
    ("from . import coop", {"trainers.coop"}),
    ("def f():\n    import trainers.dear", {"trainers.dear"}),
])
def test_imports_are_read_also_inside_functions_and_relative(source, expected):
    assert set(imported_names(source, "trainers")) == expected
