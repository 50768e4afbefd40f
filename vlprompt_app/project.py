"""The project's plain packages, ``trainers`` and ``datasets``, imported without touching sys.path.

setup.py installs only ``vlprompt``: ``trainers/`` and ``datasets/`` stay folders beside
``train.py`` (as in the CoOp family), so that installing the project never shadows
site-packages' ``datasets``. ``python train.py`` imports them because Python puts the
script's folder (the repository root) first on sys.path. Tools live in ``tools/``, so they
import them through this module instead: each package is loaded from
``<root>/<name>/__init__.py`` and registered in ``sys.modules`` under its plain name, after
which ``import trainers.dear`` and ``from datasets import ...`` work as usual.

The root is the checkout that holds the imported ``vlprompt`` (an editable install or a
source tree on PYTHONPATH): its folder must contain ``vlprompt/``, ``trainers/`` and
``datasets/``. A non-editable install has no such checkout; ``ProjectLayoutError`` then
names the folders it expected.
"""
import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Tuple

from vlprompt.paths import repository_root

PROJECT_PACKAGES = ("trainers", "datasets")


class ProjectLayoutError(ImportError):
    """The repository root lacks a project package, or another module holds its name."""


def import_project_package(name: str, root: Optional[Path] = None) -> ModuleType:
    """The project package ``name`` ("trainers" or "datasets") of ``root`` (default: repository_root()).

    Imported once and registered in ``sys.modules[name]``; a package of that name that is
    already imported is returned if it is the one in ``root``.

    Raises:
        ProjectLayoutError: ``root/name/__init__.py`` does not exist, or ``sys.modules[name]``
            is a module from elsewhere (e.g. Hugging Face's ``datasets``).
    """
    if name not in PROJECT_PACKAGES:
        raise ValueError(f"unknown project package {name!r}; choose among {PROJECT_PACKAGES}")
    root = Path(root) if root is not None else repository_root()
    init = root / name / "__init__.py"
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        if origin is not None and Path(origin).resolve() == init.resolve():
            return loaded
        raise ProjectLayoutError(
            f"the module {name!r} is already imported from {origin}, not from the project's {init}: "
            f"import the project's packages (vlprompt_app.project) before any other package called {name!r}"
        )
    if not init.is_file():
        raise ProjectLayoutError(
            f"the project package {name!r} was expected at {init}: the repository root ({root}) must hold "
            f"vlprompt/, trainers/ and datasets/ side by side. Use a source checkout, installed with "
            f"`pip install -e .` or put on PYTHONPATH; a non-editable install of vlprompt has no trainers/."
        )
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_project(root: Optional[Path] = None) -> Tuple[ModuleType, ModuleType]:
    """(trainers, datasets) of ``root``: importing them registers every trainer and dataset."""
    return tuple(import_project_package(name, root) for name in PROJECT_PACKAGES)


def registered_trainer_names(root: Optional[Path] = None, only: Optional[str] = None) -> List[str]:
    """The names ``root/trainers/`` registers, read from its source without importing it (sorted).

    A trainer is a class decorated with ``@TRAINER_REGISTRY.register()``, registered under its
    class name, so that a command can refuse an unknown ``--trainer`` before torch and every
    method are imported. A test checks that the list equals the registry after import. With
    ``only`` a name, only the files that spell ``class <only>`` are parsed (the others cannot
    register it), so the answer is ``[only]`` or ``[]`` at the cost of one file's parse.
    """
    folder = (Path(root) if root is not None else repository_root()) / "trainers"
    names = []
    for path in sorted(folder.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        if only is not None and f"class {only}" not in source:
            continue
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.ClassDef) and any(_is_trainer_registration(d) for d in node.decorator_list):
                names.append(node.name)
    return sorted(name for name in names if only is None or name == only)


def _is_trainer_registration(decorator: ast.expr) -> bool:
    call = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(call, ast.Attribute) and call.attr == "register"
            and isinstance(call.value, ast.Name) and call.value.id == "TRAINER_REGISTRY")
