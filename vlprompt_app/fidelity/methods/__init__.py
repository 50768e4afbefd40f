"""The methods compared with their official code, one module each; ``METHODS`` {name: MethodSpec}.

A method module defines ``SPECS``, a tuple of ``vlprompt_app.fidelity.spec.MethodSpec`` (the
contract: which official tree and module, how each side is built and run, which learnable values
they share under which names, what is compared, which misplacements must fail, and how the
official step is timed). Steps several methods share are in ``common``.
"""
from . import (
    atprompt, coop, dept, flyp, maple, mma, mmrl, prograd, promptalign, promptkd, promptsrc, provp, skip_tuning, tac, tcp, tpt,
    wiseft,
)

METHODS = {spec.name: spec
           for module in (coop, prograd, tcp, mma, mmrl, maple, dept, provp, promptkd, promptsrc, atprompt, skip_tuning, tac,
                          flyp, tpt, promptalign, wiseft)
           for spec in module.SPECS}

FIXTURES = {spec.fixture_name: spec for spec in METHODS.values() if spec.compared}


def method_of_fixture(stem):
    """The MethodSpec whose fixture is tests/fixtures/official/<stem>.json."""
    if stem not in FIXTURES:
        raise KeyError(f"no method records the fixture '{stem}'; known: {sorted(FIXTURES)}")
    return FIXTURES[stem]
