"""Nothing imports a layer above its own (docs/architecture.md).

Layers, bottom to top: ``vlprompt`` (the library); ``trainers`` and ``datasets``; ``vlprompt_app``
(the application); ``tools`` and ``train.py`` (command lines). Every import statement of every
Python file of a layer is read (including imports inside functions) and its top-level package
checked against the packages of the layers above.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folder -> the top-level names its files must not import.
ABOVE = {
    "vlprompt": {"trainers", "datasets", "vlprompt_app", "tools", "train"},
    "trainers": {"vlprompt_app", "tools", "train"},
    "datasets": {"vlprompt_app", "tools", "train"},
    "vlprompt_app": {"tools", "train"},
}


def upward_imports(path, forbidden):
    """(line, module) of each absolute import in ``path`` whose top-level package is in ``forbidden``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in forbidden]
    return found


@pytest.mark.parametrize("folder", sorted(ABOVE))
def test_no_layer_imports_a_layer_above_it(folder):
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 for line, module in upward_imports(path, ABOVE[folder])]
    assert not offenders, "imports of a layer above:\n" + "\n".join(offenders)


def test_the_check_sees_every_form_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nimport trainers.coop\nfrom vlprompt_app.project import x\n"
                      "def f():\n    from datasets import y\nfrom . import sibling\n")
    assert upward_imports(source, {"trainers", "datasets", "vlprompt_app"}) == [
        (2, "trainers.coop"), (3, "vlprompt_app.project"), (5, "datasets")]
