"""Registry-wide contracts keep a few representative cases in the fast loop
(``-m "not e2e and not official and not slow"``) and run every case in the full suite."""
import pytest


def representative(values, fast):
    """``values`` as ``parametrize`` arguments, the ones not in ``fast`` marked ``slow``."""
    missing = set(fast) - set(values)
    assert not missing, f"the fast cases {sorted(missing)} are not among the cases"
    return [value if value in fast else pytest.param(value, marks=pytest.mark.slow) for value in values]
