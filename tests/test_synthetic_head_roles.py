"""tools/synthetic_head_roles.py: eta^2 of a grouping, and the table on the committed tiny CLIP."""
import json

import numpy as np
import pytest

from vlprompt_app.commands import synthetic_head_roles
from toy_images import quietly  # noqa: E402

with open(synthetic_head_roles.CONFIG) as _f:
    _VISION = json.load(_f)["vision_cfg"]
HEADS = _VISION["width"] // _VISION["head_width"]  # heads per layer of the tiny synthetic CLIP


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
    rows = [line.split() for line in lines[2:] if line.split()[0].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [("6", str(head)) for head in range(HEADS)]
    for row in rows:
        shares = [float(value) for value in row[2:8]]
        assert all(0 <= share <= 1 for share in shares) and 0 <= float(row[8]) <= np.log(6)


def test_strict_specialists_need_half_the_variance_and_at_most_a_tenth_of_every_other():
    """Order of the shares: shape, color, texture, location, size, background."""
    rows = [
        (5, 0, np.array([0.05, 0.70, 0.10, 0.00, 0.02, 0.03])),  # colour specialist (other at the 0.10 limit)
        (5, 1, np.array([0.05, 0.70, 0.11, 0.00, 0.02, 0.03])),  # texture above 0.10: not one
        (5, 2, np.array([0.00, 0.00, 0.50, 0.10, 0.00, 0.00])),  # texture at the 0.50 limit
        (6, 3, np.array([0.40, 0.05, 0.05, 0.05, 0.05, 0.05])),  # shape below 0.50: not one
        (6, 4, np.array([0.18, 0.18, 0.17, 0.17, 0.15, 0.15])),  # no dominant attribute
    ]
    found = synthetic_head_roles.specialists(rows)
    assert found == {"shape": [], "color": [(5, 0)], "texture": [(5, 2)], "location": [], "size": [],
                     "background": []}
    lines = synthetic_head_roles.summary_lines(rows, dominance=0.4)
    assert "  color       1  L5H0" in lines and "  shape       0  none" in lines
    assert lines[-1].endswith(": 1 of 5")


def test_roles_follow_the_dominance_and_entropy_rule():
    """Order of the shares: shape, color, texture, location, size, background."""
    from vlprompt.clip.head_roles import HeadRole

    rows = [
        (4, 0, np.array([0.1, 0.6, 0.1, 0.1, 0.1, 0.0])),  # colour 60 %: a DeAR attribute -> A
        (4, 1, np.array([0.0, 0.0, 0.0, 0.0, 0.2, 0.8])),  # background 80 %: not one -> O
        (5, 0, np.array([0.3, 0.25, 0.25, 0.2, 0.0, 0.0])),  # shape 30 %, entropy 1.38
        (5, 1, np.array([0.2, 0.2, 0.2, 0.2, 0.2, 0.0])),  # uniform over five, entropy 1.61 (highest)
        (6, 0, np.array([0.39, 0.31, 0.3, 0.0, 0.0, 0.0])),  # shape 39 %: just below 40 %, entropy 1.09
    ]
    attributes = ["color", "shape", "texture", "object", "location"]
    roles = synthetic_head_roles.assign_roles(rows, attributes, dominance=0.4, generalization_share=0.4)
    assert roles == {(4, 0): HeadRole("A", "color"), (4, 1): HeadRole("O", "background"), (5, 0): HeadRole("G"),
                     (5, 1): HeadRole("G"), (6, 0): HeadRole("M")}  # floor(0.4 x 5) = 2 generalization heads
    roles = synthetic_head_roles.assign_roles(rows, attributes, dominance=0.39, generalization_share=0.2)
    assert roles[6, 0] == HeadRole("A", "shape") and roles[5, 1] == HeadRole("G") and roles[5, 0] == HeadRole("M")


def test_output_writes_a_role_map_whose_header_holds_the_command(tmp_path):
    from vlprompt.clip.head_roles import load_role_map

    path = tmp_path / "roles.yaml"
    argv = ["--num-images", "60", "--layers", "2", "--output", str(path)]
    _, lines = quietly(lambda: synthetic_head_roles.main(argv))
    role_map = load_role_map(str(path))
    role_map.check_backbone(6, HEADS)
    assert sorted(role_map.roles) == [5, 6] and role_map.weights == "weights/tiny-synthetic-clip.pt"
    printed = {(int(row[0]), int(row[1])): " ".join(row[11:]) for row in map(str.split, lines[2:2 + 2 * HEADS])}
    assert printed == {(layer, head): str(role_map.roles[layer][head]) for layer in (5, 6) for head in range(HEADS)}
    text = path.read_text()
    assert f"#   python tools/synthetic_head_roles.py {' '.join(argv)}\n" in text
    generalization = sum(str(role).startswith("G") for layer in role_map.roles.values() for role in layer)
    assert generalization == int(0.2 * 2 * HEADS)  # the rule's 20 % of the analysed heads, rounded down
