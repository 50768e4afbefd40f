"""Role-map files (format, validation, shuffling) and the role-based attention mask."""
import pytest
import torch

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


def test_vit_b16_map_is_the_papers_table():
    role_map = load_role_map(VIT_B16_MAP)
    assert (role_map.num_layers, role_map.num_heads, role_map.first_layer) == (12, 12, 9)
    assert role_map.attributes == ("color", "shape", "texture", "object", "location")
    # Spot checks against supp. Table 2 (layer, head): role.
    expected = {(9, 2): "M", (9, 4): "O emotion", (9, 7): "A texture", (10, 10): "A shape",
                (10, 11): "G style", (11, 2): "O animal", (11, 8): "G style", (12, 5): "A shape",
                (12, 9): "O number", (12, 10): "A color", (12, 11): "O text"}
    for (layer, head), role in expected.items():
        assert str(role_map.roles[layer][head]) == role
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
