"""Role maps found by (backbone, weights): TRAINER.DEAR.ROLE_MAP auto, names and paths, errors."""
import os

import pytest

from vlprompt.clip import role_map_registry as registry
from vlprompt.clip.head_roles import RoleMapError, load_role_map, parse_role_map
from vlprompt.clip.role_map_registry import (
    REPOSITORY, backbone_key, find_role_map, register_role_map, registered_role_maps, resolve_role_map,
)
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file

VIT_B16 = os.path.join(REPOSITORY, "configs", "head_roles", "vit_b16_openai.yaml")
TINY = os.path.join(REPOSITORY, "configs", "head_roles", "tiny_synthetic.yaml")
TINY_DISCOVERED = os.path.join(REPOSITORY, "configs", "head_roles", "tiny_synthetic_discovered.yaml")
TINY_CLIP = ("configs/clip/tiny-synthetic-clip.json", "weights/tiny-synthetic-clip.pt")


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Run from a directory outside the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_repository_root_holds_the_shipped_maps():
    assert os.path.isfile(os.path.join(REPOSITORY, "train.py")) and os.path.isfile(VIT_B16)


@pytest.mark.parametrize("backbone, weights", [
    ("ViT-B/16", ""), ("ViT-B/16", "openai"), ("ViT-B-16", "openai"), ("ViT-B-16-quickgelu", "openai"),
])
def test_auto_finds_the_papers_map_for_every_spelling_of_vit_b16_openai(backbone, weights, elsewhere):
    assert resolve_role_map("auto", backbone, weights) == (VIT_B16, "configs/head_roles/vit_b16_openai.yaml")
    role_map = find_role_map("auto", backbone, weights)
    assert (role_map.backbone, role_map.weights, role_map.num_layers, role_map.first_layer) == (
        "ViT-B/16", "openai", 12, 9)


@pytest.mark.parametrize("relative_to", ["repository", "absolute"])
def test_auto_finds_the_tiny_clips_map_from_any_directory(relative_to, elsewhere):
    name, weights = TINY_CLIP
    if relative_to == "absolute":
        name, weights = os.path.join(REPOSITORY, name), os.path.join(REPOSITORY, weights)
    assert backbone_key(name, weights) == TINY_CLIP
    file, _ = resolve_role_map("auto", name, weights)
    assert file == TINY  # the hand-made map is the default; the discovered one is selected by name
    assert find_role_map("auto", name, weights).roles == load_role_map(TINY).roles


def test_a_symlinked_checkout_path_is_the_same_key(elsewhere):
    link = elsewhere / "clip.json"
    link.symlink_to(os.path.join(REPOSITORY, TINY_CLIP[0]))
    assert backbone_key(str(link), TINY_CLIP[1]) == TINY_CLIP


def test_every_registered_map_loads_and_declares_its_own_key():
    entries = registered_role_maps()
    assert [e.name for e in entries] == ["vit_b16_openai", "tiny_synthetic", "tiny_synthetic_discovered",
                                         "tiny_synthetic_eva02_discovered"]
    for entry in entries:
        role_map = load_role_map(entry.file)
        assert backbone_key(role_map.backbone, role_map.weights) == (entry.backbone, entry.weights), entry.name
    defaults = [(e.backbone, e.weights) for e in entries if e.default]
    assert len(defaults) == len(set(defaults)) == 3


def test_a_name_or_a_path_overrides_auto(elsewhere):
    # A registered name, whatever the backbone.
    assert resolve_role_map("tiny_synthetic_discovered", "ViT-B/16")[0] == TINY_DISCOVERED
    assert resolve_role_map("vit_b16_openai", *TINY_CLIP)[0] == VIT_B16
    # A path relative to the repository, read from another directory.
    assert resolve_role_map("configs/head_roles/tiny_synthetic_discovered.yaml", "ViT-B/16")[0] == TINY_DISCOVERED
    # A file in the current directory wins over the repository's file of the same relative path.
    local = elsewhere / "configs" / "head_roles" / "tiny_synthetic_discovered.yaml"
    local.parent.mkdir(parents=True)
    parse_role_map({"num_layers": 2, "num_heads": 1, "attributes": ["color"], "roles": {2: ["A color"]}}).save(
        str(local))
    role_map = find_role_map("configs/head_roles/tiny_synthetic_discovered.yaml", "ViT-B/16")
    assert (role_map.num_layers, role_map.num_heads) == (2, 1)
    assert find_role_map(str(local), "unknown backbone").num_layers == 2


@pytest.mark.parametrize("backbone, weights, key", [
    ("ViT-B/32", "", 'backbone "ViT-B/32" with weights "openai"'),
    ("ViT-B-16", "laion2b_s34b_b88k", 'backbone "ViT-B/16" with weights "laion2b_s34b_b88k"'),
    ("configs/clip/tiny-synthetic-clip.json", "random", 'backbone "configs/clip/tiny-synthetic-clip.json" '
                                                        'with weights "random"'),
])
def test_an_unknown_backbone_lists_the_known_maps_and_the_tool(backbone, weights, key):
    with pytest.raises(ConfigError) as error:
        find_role_map("auto", backbone, weights)
    message = str(error.value)
    assert f"No head-role map is registered for {key}" in message
    assert "ViT-B/16, openai -> configs/head_roles/vit_b16_openai.yaml (vit_b16_openai)" in message
    assert ("configs/clip/tiny-synthetic-clip.json, weights/tiny-synthetic-clip.pt -> "
            "configs/head_roles/tiny_synthetic.yaml (tiny_synthetic)") in message
    assert "tiny_synthetic_discovered.yaml (tiny_synthetic_discovered; by name only" in message
    assert "tools/head_roles.py" in message and "TRAINER.DEAR.ROLE_MAP" in message


@pytest.mark.parametrize("spec, backbone, message", [
    ("missing.yaml", "ViT-B/16", r'Role map "missing.yaml" does not exist .* not a registered map name'),
    ("vit_b16", "ViT-B/16", r'(?s)Role map "vit_b16" does not exist .*Known role maps.*\(vit_b16_openai\)'),
    ("", "ViT-B/16", r'ROLE_MAP is empty: set it to "auto"'),
    ("auto", "", r"ROLE_MAP is auto, .* but no backbone was named"),
])
def test_bad_specs_say_what_is_expected(spec, backbone, message):
    with pytest.raises(RoleMapError, match=message):
        resolve_role_map(spec, backbone)


def test_registering_a_map_makes_auto_find_it(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    path = tmp_path / "b32.yaml"
    parse_role_map({"num_layers": 12, "num_heads": 12, "attributes": ["color"],
                    "roles": {12: ["A color"] + ["M"] * 11}}).save(str(path))
    register_role_map("vit_b32_openai", "ViT-B/32", "openai", str(path))  # an absolute path is kept as is
    assert resolve_role_map("auto", "ViT-B-32-quickgelu", "openai")[0] == str(path)
    with pytest.raises(ValueError, match='"vit_b32_openai" is already registered'):
        register_role_map("vit_b32_openai", "ViT-B/32", "laion", str(path))
    with pytest.raises(ValueError, match='"vit_b32_openai" is already the default role map of ViT-B/32, openai'):
        register_role_map("other", "ViT-B/32", "", str(path))
    register_role_map("other", "ViT-B/32", "", str(path), default=False)
    for bad in ("maps/b32", "b32.yaml", "auto", ""):
        with pytest.raises(ValueError, match="must be a plain name"):
            register_role_map(bad, "ViT-B/32", "x", str(path), default=False)


def test_dear_config_defaults_to_auto_and_follows_the_backbone(elsewhere):
    from trainers.dear import check_dear_config, deep_head_roles

    cfg = get_cfg_default()
    extend_cfg(cfg)
    assert cfg.TRAINER.DEAR.ROLE_MAP == "auto"
    merge_from_file(cfg, os.path.join(REPOSITORY, "configs", "trainers", "DeAR", "synthetic.yaml"))
    node, backbone = cfg.TRAINER.DEAR, cfg.MODEL.BACKBONE
    node.ROLE_MAP = "auto"
    check_dear_config(node, backbone)
    roles = deep_head_roles(node, 6, 16, backbone)
    assert roles == load_role_map(TINY).deep_roles(4)
    node.ROLE_MAP = "tiny_synthetic_discovered"
    assert deep_head_roles(node, 6, 16, backbone) == load_role_map(TINY_DISCOVERED).deep_roles(4)
    # The paper's map for ViT-B/16 (layers 9-12).
    node.ROLE_MAP, node.INJECT_LAYER, backbone.NAME, backbone.WEIGHTS = "auto", 9, "ViT-B/16", ""
    node.ATTRIBUTES = ["color", "shape", "texture", "object", "location"]
    check_dear_config(node, backbone)
    assert deep_head_roles(node, 12, 12, backbone) == load_role_map(VIT_B16).deep_roles(9)
    # No map is needed where no head is masked by role.
    backbone.NAME = "ViT-B/32"
    with pytest.raises(ConfigError, match='No head-role map is registered for backbone "ViT-B/32"'):
        check_dear_config(node, backbone)
    node.MASK_STRATEGY = "all_mixed"
    check_dear_config(node, backbone)
    assert deep_head_roles(node, 12, 12, backbone) == {}
