"""A method is one file of ``trainers/`` (and its configs): the folder is discovered, not listed,
and no method file imports another (what two methods share is a family base of the library,
``vlprompt/methods/``)."""
import ast
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from vlprompt.engine import TRAINER_REGISTRY
from vlprompt_app.benchmarking import trainer_cases
from vlprompt_app.project import registered_trainer_names

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "trainers"

def imported_trainer_modules(source, package="trainers"):
    """Names of the modules of ``package`` that a module of it imports (relative or absolute, also
    inside functions): ``from .coop import X``, ``from . import coop``, ``import trainers.coop``,
    ``from trainers import coop`` and ``from trainers.coop import X`` all give "coop"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith(f"{package}.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == package or module.startswith(f"{package}."):
                within = module if node.level == 1 else module[len(package) + 1:]
                if within:
                    found.add(within.split(".")[0])
                else:  # from . import coop / from trainers import coop
                    found |= {alias.name for alias in node.names}
    return found


def trainer_imports():
    """{(importer, imported)} over the method files of trainers/."""
    return {(path.stem, imported) for path in sorted(TRAINERS.glob("*.py")) if path.stem != "__init__"
            for imported in imported_trainer_modules(path.read_text(encoding="utf-8"))}


def test_no_method_file_imports_another():
    imports = sorted(trainer_imports())
    assert not imports, (
        f"method files import other method files (importer, imported): {imports}. Move what they share "
        "into a family base of vlprompt/methods/ and import it from there.")


@pytest.mark.parametrize("source, expected", [
    ("from .coop import CoOpCLIP", {"coop"}),
    ("from . import coop, maple", {"coop", "maple"}),
    ("import trainers.coop", {"coop"}),
    ("from trainers import coop", {"coop"}),
    ("from trainers.maple import MaPLeCLIP", {"maple"}),
    ("def build():\n    from .tpt import PromptTuning", {"tpt"}),
    ("from vlprompt.methods.text_context import CoOpCLIP\nimport trainers_extra", set()),
])
def test_imports_of_method_files_are_found_in_every_form(source, expected):
    assert imported_trainer_modules(source) == expected


def test_a_method_file_is_found_without_a_list(tmp_path, monkeypatch):
    """A copy of trainers/__init__.py beside one new method file: the file's trainer is read from the
    source (as train.py does before importing), registered by importing the package, and its declared
    benchmark case is collected; nothing else names it."""
    folder = tmp_path / "trainers"
    folder.mkdir()
    shutil.copy(TRAINERS / "__init__.py", folder / "__init__.py")
    (folder / "toy_discovered.py").write_text(
        "from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer\n"
        "from vlprompt.engine.benchmark_case import TRAIN, Case\n\n\n"
        "@TRAINER_REGISTRY.register()\n"
        "class ToyDiscoveredMethod(ClipTrainer):\n"
        "    benchmark_cases = (Case(\"CoOp/vit_b16.yaml\", TRAIN),)\n"
    )
    assert registered_trainer_names(tmp_path) == ["ToyDiscoveredMethod"]

    monkeypatch.setattr(TRAINER_REGISTRY, "_obj_map", dict(TRAINER_REGISTRY._obj_map))  # registered for this test
    name = "toy_discovered_trainers"  # not "trainers": the project's package stays imported
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, package)
    spec.loader.exec_module(package)
    monkeypatch.delitem(sys.modules, f"{name}.toy_discovered")
    assert "ToyDiscoveredMethod" in TRAINER_REGISTRY.registered_names()
    case, = trainer_cases.cases_of("ToyDiscoveredMethod")
    assert (case.trainer, case.name, case.config) == ("ToyDiscoveredMethod", "ToyDiscoveredMethod", "CoOp/vit_b16.yaml")


def test_the_project_package_lists_no_module():
    """trainers/__init__.py imports its folder's modules by listing the folder, not by name."""
    tree = ast.parse((TRAINERS / "__init__.py").read_text(encoding="utf-8"))
    named = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert named == []
    assert len(registered_trainer_names()) >= 35


def test_a_name_is_looked_up_in_the_files_that_spell_its_class():
    """``only=`` answers [name] or [] like the full list (a class spelled but not registered, a
    name that is a prefix of another, an unknown name)."""
    names = registered_trainer_names()
    assert all(registered_trainer_names(only=name) == [name] for name in names)
    assert registered_trainer_names(only="DeA") == [] and registered_trainer_names(only="NoSuchMethod") == []
    assert "DeARCLIP" not in names and registered_trainer_names(only="DeARCLIP") == []  # in dear.py, not registered
