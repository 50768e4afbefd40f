"""The import graph of the project's own code: no module imports a layer above its own, no two
modules import each other, directly or through others, and neither do two members of a package.

Layers, from the bottom: ``vlprompt`` (the library); ``trainers`` and ``datasets`` (methods
and datasets, on the library); ``vlprompt_app`` (the application, above them); the command
lines ``train.py`` and ``tools/*.py`` on top. Every import statement counts, also one inside
a function, since it runs whenever that function does.

The members of a package are its modules and subpackages, a subpackage standing for every
module under it, and the package's own ``__init__``: at every level of nesting (the project's
top-level packages; ``vlprompt``'s ``config``, ``data``, ``engine``, ...; ``vlprompt_app``'s
``commands``, ``protocols``, ...; and so on down) the members' imports form no cycle, so every
package has an order from the bottom up in which each member uses only the ones below it.
"""
import ast
from functools import lru_cache
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


# The fields that hold nested statements (an import is a statement: no expression holds one).
STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def statements(nodes):
    """Every statement in ``nodes`` and, nested, in their bodies (functions, classes, branches,
    loops, with, try and its handlers, match cases), without walking the expressions."""
    for node in nodes:
        yield node
        for field in STATEMENT_FIELDS:
            nested = getattr(node, field, None)
            if isinstance(nested, list):
                yield from statements(nested)


def imported_names(source: str, name: str):
    """Absolute dotted names imported by the source of module ``name`` (``from a import b``
    gives ``a.b``, which resolves to module ``a.b`` if there is one, else to ``a``)."""
    tree = ast.parse(source)
    package = name if is_package(name) else name.rpartition(".")[0]
    for node in statements(tree.body):
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


@lru_cache(maxsize=1)
def project_import_graph():
    """:func:`import_graph` of the checkout, read once."""
    return import_graph()


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


INIT = "__init__"


def member(module: str, package: str) -> str:
    """The member of ``package`` ("" = the project root) that ``module`` belongs to: the package's
    child holding it (``vlprompt.engine.trainer`` in ``vlprompt`` is ``vlprompt.engine``), or
    ``<package>.__init__`` for the package itself; "" when the module is outside the package."""
    if module == package:
        return f"{package}.{INIT}"
    prefix = f"{package}." if package else ""
    if not module.startswith(prefix):
        return ""
    return prefix + module[len(prefix):].split(".")[0]


def member_graph(graph, package: str):
    """({member: set of members it imports}, {(member, member): the module imports that make
    that edge}) among the members of ``package`` ("" = the project's top level)."""
    members, reasons = {}, {}
    for source, targets in graph.items():
        source_member = member(source, package)
        if not source_member:
            continue
        members.setdefault(source_member, set())
        for target in targets:
            target_member = member(target, package)
            if target_member and target_member != source_member:
                members[source_member].add(target_member)
                reasons.setdefault((source_member, target_member), []).append(f"{source} imports {target}")
    return members, reasons


def package_cycles(graph):
    """{package: [a description of each cycle among its members]} for every package of ``graph``
    (and the top level) whose members import each other in a cycle."""
    packages = sorted({name for name in graph if any(other.startswith(f"{name}.") for other in graph)})
    found = {}
    for package in [""] + packages:
        members, reasons = member_graph(graph, package)
        for component in cycles(members):
            edges = [reason for a in component for b in component for reason in reasons.get((a, b), ())]
            found.setdefault(package or "(top level)", []).append(f"{' <-> '.join(component)}: {'; '.join(edges)}")
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(project_import_graph()) == []


def test_the_project_has_no_import_cycle():
    assert cycles(project_import_graph()) == []


def test_no_package_has_a_cycle_among_its_members():
    """E.g. ``vlprompt.config.x`` importing ``vlprompt.data.y`` while ``vlprompt.data.z`` imports
    ``vlprompt.config`` is no module cycle, but makes config and data depend on each other."""
    found = package_cycles(project_import_graph())
    assert found == {}, "\n".join(f"{package}: {cycle}" for package, cycles_ in found.items() for cycle in cycles_)


def test_member_cycles_are_found_at_every_level():
    graph = {
        "vlprompt": {"vlprompt.export"},  # the package's __init__ is a member of its own
        "vlprompt.export": {"vlprompt.engine.trainer"},
        "vlprompt.engine": set(),
        "vlprompt.engine.trainer": set(),
        "vlprompt.engine.results": {"vlprompt"},
        "vlprompt.config": set(),
        "vlprompt.config.checks": {"vlprompt.data.samplers"},
        "vlprompt.data": set(),
        "vlprompt.data.samplers": set(),
        "vlprompt.data.views": {"vlprompt.config"},
        "vlprompt_app": set(),
        "vlprompt_app.protocols": set(),
        "vlprompt_app.protocols.execute": {"vlprompt_app.commands.train"},
        "vlprompt_app.commands": set(),
        "vlprompt_app.commands.train": set(),
        "vlprompt_app.commands.run_protocol": {"vlprompt_app.protocols.execute"},
    }
    assert cycles(graph) == []  # no module imports itself through others
    assert member_graph(graph, "vlprompt")[0]["vlprompt.config"] == {"vlprompt.data"}
    assert member("vlprompt.engine.trainer", "") == "vlprompt" and member("trainers.coop", "vlprompt") == ""
    assert package_cycles(graph) == {
        "vlprompt": [
            "vlprompt.__init__ <-> vlprompt.engine <-> vlprompt.export: vlprompt imports vlprompt.export; "
            "vlprompt.engine.results imports vlprompt; vlprompt.export imports vlprompt.engine.trainer",
            "vlprompt.config <-> vlprompt.data: vlprompt.config.checks imports vlprompt.data.samplers; "
            "vlprompt.data.views imports vlprompt.config",
        ],
        "vlprompt_app": [
            "vlprompt_app.commands <-> vlprompt_app.protocols: vlprompt_app.commands.run_protocol imports "
            "vlprompt_app.protocols.execute; vlprompt_app.protocols.execute imports vlprompt_app.commands.train",
        ],
    }


def test_the_checks_catch_an_upward_import_and_a_cycle():
    graph = {"vlprompt.a": {"trainers.coop"}, "trainers.coop": {"vlprompt.a"}, "tools.x": {"vlprompt_app.y"},
             "vlprompt_app.y": set()}
    assert upward_imports(graph) == ["vlprompt.a imports trainers.coop"]
    assert cycles(graph) == [["trainers.coop", "vlprompt.a"]]


@pytest.mark.parametrize("source, expected", [
    ("from vlprompt.engine.results import write_results", {"vlprompt.engine.results.write_results"}),
    ("from . import coop", {"trainers.coop"}),
    ("def f():\n    import trainers.dear", {"trainers.dear"}),
    ("class A:\n    def f(self):\n        try:\n            pass\n        except ImportError:\n"
     "            import trainers.dear\n        else:\n            import trainers.coop\n"
     "        finally:\n            import trainers.vpt\n"
     "        with open('x'):\n            match x:\n                case 1:\n                    import trainers.mma",
     {"trainers.dear", "trainers.coop", "trainers.vpt", "trainers.mma"}),
])
def test_imports_are_read_also_inside_functions_and_relative(source, expected):
    assert set(imported_names(source, "trainers")) == expected
