"""Config inheritance: ``_BASE_: relative/path.yaml`` in vlprompt.config.merge_from_file; the merge and
``dump_cfg`` give what yacs's own merge and dump give."""
import os

import pytest
import yaml
from yacs.config import CfgNode

import trainers  # noqa: F401  (registers every trainer's config node)
from vlprompt.config import ConfigError, config_chain, dump_cfg, extend_cfg, get_cfg_default, merge_from_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLIP_BASE = """\
INPUT:
  INTERPOLATION: "bicubic"
  TRANSFORMS: ["random_resized_crop", "random_flip", "normalize"]
OPTIM:
  NAME: "sgd"
  LR: 0.002
"""


def write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def family(tmp_path):
    """configs/_base_/clip.yaml <- configs/CoOp/rn50.yaml <- configs/CoOp/rn50_ctx.yaml"""
    write(tmp_path, "configs/_base_/clip.yaml", CLIP_BASE)
    write(tmp_path, "configs/CoOp/rn50.yaml",
          '_BASE_: ../_base_/clip.yaml\nOPTIM:\n  MAX_EPOCH: 50\nMODEL:\n  BACKBONE:\n    NAME: "RN50"\n')
    leaf = write(tmp_path, "configs/CoOp/rn50_ctx.yaml",
                 '_BASE_: "rn50.yaml"\nINPUT:\n  TRANSFORMS: ["normalize"]\nOPTIM:\n  LR: 0.01\n')
    return tmp_path, leaf


def test_chained_bases_merge_base_first_and_the_child_overrides(family):
    _, leaf = family
    cfg = get_cfg_default()
    merge_from_file(cfg, leaf)
    assert cfg.OPTIM.LR == 0.01  # the leaf overrides the grandparent
    assert cfg.OPTIM.NAME == "sgd" and cfg.INPUT.INTERPOLATION == "bicubic"  # from the grandparent
    assert cfg.OPTIM.MAX_EPOCH == 50 and cfg.MODEL.BACKBONE.NAME == "RN50"  # from the parent
    assert list(cfg.INPUT.TRANSFORMS) == ["normalize"]  # a list replaces the base's list
    assert cfg.OPTIM.WARMUP_EPOCH == -1  # untouched keys keep their default


def test_base_paths_are_relative_to_the_file_not_the_working_directory(family, monkeypatch):
    root, leaf = family
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = get_cfg_default()
    merge_from_file(cfg, os.path.relpath(leaf))
    assert cfg.OPTIM.NAME == "sgd"


def test_config_chain_lists_the_files_base_first_without_the_base_key(family):
    root, leaf = family
    chain = config_chain(leaf)
    assert [os.path.relpath(file, root) for file, _ in chain] == [
        os.path.join("configs", "_base_", "clip.yaml"), os.path.join("configs", "CoOp", "rn50.yaml"),
        os.path.join("configs", "CoOp", "rn50_ctx.yaml")]
    assert all("_BASE_" not in node for _, node in chain)
    assert chain[1][1].OPTIM.MAX_EPOCH == 50


def test_absolute_base_path(tmp_path):
    base = write(tmp_path, "a/base.yaml", "OPTIM:\n  LR: 0.5\n")
    child = write(tmp_path, "b/child.yaml", f'_BASE_: "{base}"\n')
    cfg = get_cfg_default()
    merge_from_file(cfg, child)
    assert cfg.OPTIM.LR == 0.5


def test_missing_base_names_the_file_that_names_it_and_the_chain(tmp_path):
    write(tmp_path, "mid.yaml", "_BASE_: nowhere/gone.yaml\n")
    child = write(tmp_path, "child.yaml", "_BASE_: mid.yaml\n")
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_file(cfg, child)
    message = str(info.value)
    mid, gone = str(tmp_path / "mid.yaml"), str(tmp_path / "nowhere" / "gone.yaml")
    assert message.startswith(f'Config file "{mid}" names _BASE_: "nowhere/gone.yaml", which does not exist')
    assert f'looked for "{gone}"' in message and "relative to the folder of the file that names them" in message
    assert f'Chain: "{child}" -> "{mid}" -> "{gone}".' in message


@pytest.mark.parametrize("files, expected_chain", [
    ({"a.yaml": "_BASE_: b.yaml\n", "b.yaml": "_BASE_: a.yaml\n"}, ["a.yaml", "b.yaml", "a.yaml"]),
    ({"a.yaml": "_BASE_: ./a.yaml\n"}, ["a.yaml", "a.yaml"]),
    ({"a.yaml": "_BASE_: b.yaml\n", "b.yaml": "_BASE_: c.yaml\n", "c.yaml": "_BASE_: b.yaml\n"},
     ["a.yaml", "b.yaml", "c.yaml", "b.yaml"]),
])
def test_cycles_are_errors_naming_the_chain(tmp_path, files, expected_chain):
    for name, text in files.items():
        write(tmp_path, name, text)
    leaf = str(tmp_path / "a.yaml")
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), leaf)
    chain = " -> ".join(f'"{tmp_path / name}"' for name in expected_chain)
    assert str(info.value) == f'Config file "{leaf}" inherits from itself through _BASE_: {chain}.'


@pytest.mark.parametrize("value, shown", [("3", "3 (int)"), ("null", "None (None)"), ("[a.yaml]", "['a.yaml'] (list or tuple)"),
                                          ('""', "'' (str)")])
def test_a_base_that_is_not_a_path_string_is_an_error_naming_the_file(tmp_path, value, shown):
    write(tmp_path, "base.yaml", "_BASE_: " + value + "\n")
    child = write(tmp_path, "child.yaml", "_BASE_: base.yaml\n")
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), child)
    assert str(info.value).startswith(f'Config file "{tmp_path / "base.yaml"}" has _BASE_: {shown}, but _BASE_ '
                                      "must be the path of a base config file")


def test_unknown_key_in_a_base_names_the_base_and_the_chain_and_merges_nothing(family):
    root, leaf = family
    write(root, "configs/_base_/clip.yaml", CLIP_BASE + "  LRR: 0.1\n")
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_file(cfg, leaf)
    base, parent = root / "configs/_base_/clip.yaml", root / "configs/CoOp/rn50.yaml"
    message = str(info.value)
    assert message.startswith(
        f'Unknown config key "OPTIM.LRR" (from config file "{base}", in the _BASE_ chain '
        f'"{leaf}" -> "{parent}" -> "{base}").')
    assert "Closest existing keys: OPTIM.LR," in message
    assert cfg == get_cfg_default()  # every file is checked before anything is merged


def test_bad_values_are_blamed_on_the_file_they_come_from(family):
    root, leaf = family
    write(root, "configs/CoOp/rn50.yaml", '_BASE_: ../_base_/clip.yaml\nOPTIM:\n  MAX_EPOCH: 50.0\n')
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), leaf)
    assert f'"OPTIM.MAX_EPOCH" (from config file "{root / "configs/CoOp/rn50.yaml"}", in the _BASE_ chain' in str(info.value)
    assert "Write 50 instead of 50.0." in str(info.value)

    write(root, "configs/CoOp/rn50.yaml", '_BASE_: ../_base_/clip.yaml\n')
    write(root, "configs/CoOp/rn50_ctx.yaml", '_BASE_: rn50.yaml\nOPTIM:\n  LR: 1\n')
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), leaf)
    assert f'"OPTIM.LR" (from config file "{leaf}", in the _BASE_ chain' in str(info.value)


def test_invalid_yaml_in_a_base_names_the_base(tmp_path):
    base = write(tmp_path, "base.yaml", "INPUT:\n  SIZE: [224, 224\n")
    child = write(tmp_path, "child.yaml", "_BASE_: base.yaml\n")
    with pytest.raises(ConfigError, match=f'Config file "{base}" is not valid YAML'):
        merge_from_file(get_cfg_default(), child)


def test_a_nested_base_key_is_unknown_and_says_where_base_goes(tmp_path):
    child = write(tmp_path, "child.yaml", "OPTIM:\n  _BASE_: base.yaml\n")
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), child)
    assert 'Unknown config key "OPTIM._BASE_"' in str(info.value)
    assert "_BASE_ (the base config's path) is only read at the top level of a config file." in str(info.value)


def test_a_file_without_base_is_named_alone(tmp_path):
    path = write(tmp_path, "plain.yaml", "OPTIM:\n  LRR: 0.1\n")
    with pytest.raises(ConfigError) as info:
        merge_from_file(get_cfg_default(), path)
    assert f'(from config file "{path}").' in str(info.value)



def yacs_merge(cfg, path):
    """The reference: yacs's own ``CfgNode(data)`` and ``merge_from_other_cfg`` over the chain."""
    for _, node in config_chain(path):
        cfg.merge_from_other_cfg(CfgNode(dict(node)))


def as_typed_tree(node):
    """Keys, their order, value types and values, and the groups' flags, of a CfgNode."""
    if isinstance(node, CfgNode):
        return ("group", node.is_new_allowed(), node.is_frozen(),
                [(key, as_typed_tree(value)) for key, value in node.items()])
    return type(node).__name__, repr(node)


@pytest.mark.parametrize("path", ["configs/trainers/MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml",
                                  "configs/trainers/DeAR/vit_b16_base2new.yaml", "configs/datasets/oxford_pets.yaml"])
def test_merge_builds_what_yacs_merging_builds(path, monkeypatch):
    """merge_from_file merges without yacs's copies of every subtree: the same keys in the same order,
    the same value types (lists and tuples coerced as yacs coerces them) and values."""
    monkeypatch.chdir(ROOT)
    ours, theirs, defaults = get_cfg_default(), get_cfg_default(), get_cfg_default()
    for cfg in (ours, theirs, defaults):
        extend_cfg(cfg)
    merge_from_file(ours, path)
    yacs_merge(theirs, path)
    assert as_typed_tree(ours) == as_typed_tree(theirs) != as_typed_tree(defaults)


@pytest.mark.parametrize("strings", ["ascii", "escaped"])
def test_dump_cfg_writes_what_yacs_dump_writes(strings, monkeypatch):
    """dump_cfg writes printable-ASCII configs with libyaml's emitter and the others as yacs does: the
    text equals ``cfg.dump()`` either way (libyaml folds a long escaped string at another place)."""
    monkeypatch.chdir(ROOT)
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, "configs/trainers/DeAR/vit_b16_base2new.yaml")
    if strings == "escaped":
        cfg.DATASET.ROOT = "datasets/\u65e5\u672c/\r" + "x" * 20 + "\u00e9" * 60
    assert dump_cfg(cfg) == cfg.dump()
    if strings == "escaped":
        assert yaml.dump(yaml.safe_load(cfg.dump()), Dumper=yaml.CSafeDumper) != cfg.dump()
