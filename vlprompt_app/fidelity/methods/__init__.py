"""The methods compared with their official code, one module each; ``METHODS`` {name: MethodSpec}.

A method module defines ``SPECS``, a tuple of ``vlprompt_app.fidelity.spec.MethodSpec`` (the
contract: which official tree and module, how each side is built and run, which learnable values
they share under which names, what is compared, which misplacements must fail, and how the
official step is timed). Every module of this folder is imported, in the order of their names,
and the specs of those that define ``SPECS`` are collected: a new comparison is a new file, with
no list to extend. Steps several methods share are in ``common`` (which defines no ``SPECS``).
"""
import importlib
import pkgutil


def _collect_specs():
    specs = {}
    for name in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        module = importlib.import_module(f"{__name__}.{name}")
        for spec in getattr(module, "SPECS", ()):
            if spec.name in specs:
                raise ValueError(f"two fidelity specs are named {spec.name!r} (the second in {module.__name__})")
            specs[spec.name] = spec
    return specs


METHODS = _collect_specs()

FIXTURES = {spec.fixture_name: spec for spec in METHODS.values() if spec.compared}


def method_of_fixture(stem):
    """The MethodSpec whose fixture is tests/fixtures/official/<stem>.json."""
    if stem not in FIXTURES:
        raise KeyError(f"no method records the fixture '{stem}'; known: {sorted(FIXTURES)}")
    return FIXTURES[stem]
