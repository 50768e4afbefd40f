"""tools/synthetic_head_roles.py: eta^2 of a grouping, and the table on the committed tiny CLIP."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import synthetic_head_roles  # noqa: E402
from toy_images import quietly  # noqa: E402


def test_eta_squared_is_the_share_of_variance_between_groups():
    values = np.array([0, 0, 1, 1])
    grouped = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, -2.0], [3.0, -2.0]])  # constant within each group
    assert synthetic_head_roles.eta_squared(grouped, values) == pytest.approx(1.0)
    within = np.array([[1.0], [-1.0], [1.0], [-1.0]])  # same mean in both groups
    assert synthetic_head_roles.eta_squared(within, values) == pytest.approx(0.0)
    mixed = np.array([[0.0], [2.0], [4.0], [6.0]])  # group means 1 and 5 around 3: between 2*4 + 2*4 of total 20
    assert synthetic_head_roles.eta_squared(mixed, values) == pytest.approx(16 / 20)


def test_table_has_a_row_per_analysed_head():
    _, lines = quietly(lambda: synthetic_head_roles.main(["--num-images", "60", "--layers", "1"]))
    rows = [line.split() for line in lines[2:]]
    assert [(row[0], row[1]) for row in rows] == [("6", str(head)) for head in range(4)]
    for row in rows:
        shares = [float(value) for value in row[2:8]]
        assert all(0 <= share <= 1 for share in shares) and 0 <= float(row[8]) <= np.log(6)
