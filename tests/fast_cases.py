"""Registry-wide contracts keep a few representative cases in the fast loop
(``-m "not e2e and not official and not slow"``) and run every case in the full suite."""
import pytest


def representative(values, fast, name=None):
    """``values`` as ``parametrize`` arguments, the ones whose name (``name(value)``, default the
    value itself, also the test id then) is not in ``fast`` marked ``slow``."""
    names = [value if name is None else name(value) for value in values]
    missing = set(fast) - set(names)
    assert not missing, f"the fast cases {sorted(missing)} are not among the cases"
    return [pytest.param(value, id=None if name is None else label, marks=() if label in fast else pytest.mark.slow)
            for value, label in zip(values, names)]
