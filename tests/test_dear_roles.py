"""Role-map files (format, validation, shuffling) and the role-based attention mask."""
import re

import pytest

from vlprompt.clip.head_roles import HeadRole, RoleMapError, load_role_map, parse_role_map, role_attention_mask
from vlprompt.config import ConfigError

VIT_B16_MAP = "configs/head_roles/vit_b16_openai.yaml"


def tiny_map_data(**changes):
    """A valid map for a 3-layer, 4-head tower (deep layers 2..3)."""
    data = {
        "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
        "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
    }
    data.update(changes)
    return data


# The DeAR supplement's Table 2 ("Detailed functional role classification for Attention Heads
# in Layers 9-12 of ViT-B/16"), column "Head" and "Role (Concept)", as printed there.
SUPPLEMENT_TABLE_2 = """
(9, 0) Core Attribute (Location)      (10, 0) Core Attribute (Object)     (11, 0) Core Attribute (Object)
(9, 1) Core Attribute (Location)      (10, 1) Core Attribute (Color)      (11, 1) Core Attribute (Color)
(9, 2) Mixed                          (10, 2) Core Attribute (Texture)    (11, 2) Other Specialized (Animal)
(9, 3) Core Attribute (Location)      (10, 3) Core Attribute (Location)   (11, 3) Core Attribute (Location)
(9, 4) Other Specialized (Emotion)    (10, 4) Other Specialized (Human)   (11, 4) Core Attribute (Texture)
(9, 5) Generalization (Style)         (10, 5) Core Attribute (Object)     (11, 5) Core Attribute (Texture)
(9, 6) Mixed                          (10, 6) Core Attribute (Location)   (11, 6) Core Attribute (Location)
(9, 7) Core Attribute (Texture)       (10, 7) Generalization (Style)      (11, 7) Other Specialized (Action)
(9, 8) Other Specialized (Text)       (10, 8) Core Attribute (Location)   (11, 8) Generalization (Style)
(9, 9) Core Attribute (Location)      (10, 9) Core Attribute (Object)     (11, 9) Core Attribute (Object)
(9, 10) Generalization (Style)        (10, 10) Core Attribute (Shape)     (11, 10) Core Attribute (Location)
(9, 11) Mixed                         (10, 11) Generalization (Style)     (11, 11) Core Attribute (Location)
(12, 0) Core Attribute (Location)     (12, 4) Other Specialized (Human)   (12, 8) Mixed
(12, 1) Generalization (Style)        (12, 5) Core Attribute (Shape)      (12, 9) Other Specialized (Number)
(12, 2) Generalization (Style)        (12, 6) Core Attribute (Location)   (12, 10) Core Attribute (Color)
(12, 3) Mixed                         (12, 7) Core Attribute (Object)     (12, 11) Other Specialized (Text)
"""
_TABLE_ROLE = {"Core Attribute": "A", "Other Specialized": "O", "Generalization": "G", "Mixed": "M"}


def supplement_table_2():
    """{(layer, head): role string of the map format} from SUPPLEMENT_TABLE_2."""
    cells = {}
    for layer, head, role, concept in re.findall(
            r"\((\d+), (\d+)\) ([A-Z][a-z]+(?: [A-Z][a-z]+)?)(?: \((\w+)\))?", SUPPLEMENT_TABLE_2):
        key = (int(layer), int(head))
        assert key not in cells, f"cell {key} listed twice"
        cells[key] = f"{_TABLE_ROLE[role]} {concept.lower()}".strip()
    return cells


def test_vit_b16_map_is_the_papers_table():
    """Every one of the 48 cells (layers 9-12 x heads 0-11) of supp. Table 2."""
    role_map = load_role_map(VIT_B16_MAP)
    assert (role_map.num_layers, role_map.num_heads, role_map.first_layer) == (12, 12, 9)
    assert role_map.attributes == ("color", "shape", "texture", "object", "location")
    expected = supplement_table_2()
    assert sorted(expected) == [(layer, head) for layer in range(9, 13) for head in range(12)]
    found = {(layer, head): str(role) for layer, roles in role_map.roles.items() for head, role in enumerate(roles)}
    assert sorted(found) == sorted(expected)
    wrong = {cell: (found[cell], role) for cell, role in expected.items() if found[cell] != role}
    assert not wrong, f"(layer, head): (map, supplement): {wrong}"
    kinds = [role.kind for layer in role_map.roles.values() for role in layer]
    assert [kinds.count(k) for k in "AOGM"] == [28, 8, 7, 5]


def test_file_round_trip(tmp_path):
    role_map = load_role_map(VIT_B16_MAP)
    path = tmp_path / "copy.yaml"
    role_map.save(str(path))
    again = load_role_map(str(path))
    assert again.roles == role_map.roles and again.attributes == role_map.attributes
    assert (again.backbone, again.weights) == ("ViT-B/16", "openai")


@pytest.mark.parametrize("changes, message", [
    ({"roles": {2: ["A color", "G", "M"], 3: ["A shape", "A color", "G", "M"]}},
     r"layer 2 is missing head\(s\): it lists 3 roles, but num_heads is 4"),
    ({"roles": {2: ["A colour", "G", "M", "M"], 3: ["A shape", "A color", "G", "M"]}},
     r'layer 2, head 0: unknown attribute "colour" in role "A colour"'),
    ({"roles": {2: ["A color", "G", "M", "M"], 4: ["A shape", "A color", "G", "M"]}},
     r"layer 4 is out of range: layers are 1..3"),
    ({"roles": {1: ["M"] * 4, 3: ["M"] * 4}}, r"layer 2 is missing; the deep layers 1..3 must all be listed"),
    ({"roles": {2: ["A color", "X", "M", "M"], 3: ["M"] * 4}},
     r'layer 2, head 1: role "X" does not start with A, O, G or M'),
    ({"roles": {2: ["A", "G", "M", "M"], 3: ["M"] * 4}}, r'layer 2, head 0: role "A" needs a concept'),
    ({"num_heads": 0}, r"num_heads must be a positive whole number"),
    ({"colour_map": 1}, r'unknown key "colour_map"'),
])
def test_invalid_maps_name_the_bad_entry(changes, message):
    with pytest.raises(RoleMapError, match=message):
        parse_role_map(tiny_map_data(**changes), source="role map \"tiny.yaml\"")


def test_role_map_errors_are_config_errors_and_checks_name_the_problem(tmp_path):
    role_map = parse_role_map(tiny_map_data())
    with pytest.raises(ConfigError, match="3 layers of 4 heads .* loaded backbone has 12 layers of 12 heads"):
        role_map.check_backbone(12, 12)
    with pytest.raises(ConfigError, match="injection layer is 1, but .* only for layers 2..3: layer 1 has no roles"):
        role_map.check_inject_layer(1)
    role_map.check_inject_layer(3)  # layers listed below J are allowed (unused)
    with pytest.raises(ConfigError, match='Attribute "texture" .* are color, shape, text'):
        role_map.check_attributes(["color", "texture"])
    role_map.check_attributes(["text"])  # a specialised concept may be promoted to an attribute
    with pytest.raises(ConfigError, match="does not exist"):
        load_role_map(str(tmp_path / "missing.yaml"))


def test_shuffle_permutes_the_deep_heads_deterministically():
    role_map = load_role_map(VIT_B16_MAP)
    a, b, c = role_map.shuffled(3, 9), role_map.shuffled(3, 9), role_map.shuffled(4, 9)
    assert a.roles == b.roles and a.roles != c.roles and a.roles != role_map.roles
    flat = lambda m: sorted(str(r) for layer in m.roles.values() for r in layer)  # noqa: E731
    assert flat(a) == flat(role_map)
    assert all(len(layer) == 12 for layer in a.roles.values())
    # Only layers >= the first shuffled layer move.
    d = role_map.shuffled(3, 11)
    assert d.roles[9] == role_map.roles[9] and d.roles[10] == role_map.roles[10]


def test_role_mask_follows_eq_8_and_9():
    """Sequence: 3 original tokens, then color x2 and shape x2 attribute tokens."""
    roles = [HeadRole.parse(r) for r in ("A color", "G style", "M", "O text", "A texture")]
    mask = role_attention_mask(roles, ["color", "shape"], num_original=3, tokens_per_attribute=2)
    assert mask.shape == (5, 7, 7)
    allowed = mask == 0
    orig, color, shape = slice(0, 3), slice(3, 5), slice(5, 7)
    # Core colour head: every query sees the originals and the colour tokens, no shape token.
    assert allowed[0][:, orig].all() and allowed[0][:, color].all() and not allowed[0][:, shape].any()
    # Generalization, other specialised and a core head of an unused attribute: isolated.
    for head in (1, 3, 4):
        assert allowed[head][orig, orig].all() and allowed[head][3:, 3:].all()
        assert not allowed[head][orig, 3:].any() and not allowed[head][3:, orig].any()
    assert allowed[2].all()  # mixed
    # A specialised concept used as an attribute makes its heads core heads of it.
    promoted = role_attention_mask([HeadRole.parse("O text")], ["color", "text"], 3, 1)
    assert (promoted[0][:, 3] == float("-inf")).all() and (promoted[0][:, [0, 1, 2, 4]] == 0).all()
    assert role_attention_mask([HeadRole("M")] * 2, ["color"], 3, 1) is None
    assert role_attention_mask(roles, [], 3, 1) is None
