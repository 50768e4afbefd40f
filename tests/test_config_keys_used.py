"""No accepted config key is silently ignored.

Every leaf key of the merged defaults (core keys and every trainer's TRAINER.<NAME> node,
built as train.py builds them) is either read somewhere in vlprompt/, trainers/, datasets/,
tools/ or train.py (static scan: tests/config_key_usage.py), or listed in
``vlprompt.engine.config_checks.UNSUPPORTED_KEYS``, whose non-default values validate_cfg rejects.
"""
import textwrap

import pytest
from yacs.config import CfgNode as CN

import datasets  # noqa: F401  (imported by train.py before its config is built)
import trainers  # noqa: F401  (registers every trainer's config node, as train.py does)
from config_key_usage import config_keys, unread_keys
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine.config_checks import UNSUPPORTED_KEYS, validate_cfg


def merged_defaults():
    cfg = get_cfg_default()
    extend_cfg(cfg)
    return cfg


@pytest.fixture(scope="module")
def unread():
    return unread_keys(merged_defaults())


def test_every_key_is_read_or_rejected(unread):
    cfg = merged_defaults()
    assert any(key[:2] == ("TRAINER", "DEAR") for key in config_keys(cfg)), "trainer nodes were not added"
    ignored = [key for key in unread if key not in UNSUPPORTED_KEYS]
    assert not ignored, (
        f"Config keys that no code reads and validate_cfg does not reject: {ignored}. Read each key "
        "where it applies, or add it to vlprompt.engine.config_checks.UNSUPPORTED_KEYS with the reason."
    )


def test_unsupported_keys_exist_and_are_unread(unread):
    keys = {".".join(key) for key in config_keys(merged_defaults())}
    assert set(UNSUPPORTED_KEYS) <= keys
    assert set(UNSUPPORTED_KEYS) <= set(unread), "a key the code reads should not be listed as unsupported"


def _other_value(default):
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default + 0.25
    if isinstance(default, str):
        return "smaller_one" if default == "train_x" else "mlp"
    if isinstance(default, (list, tuple)):
        return [512]
    raise AssertionError(f"no other value for {default!r}")


@pytest.mark.parametrize("key", sorted(UNSUPPORTED_KEYS))
def test_unsupported_key_with_another_value_is_rejected(key):
    cfg = merged_defaults()
    default = cfg
    for name in key.split("."):
        default = default[name]
    merge_from_list(cfg, [key, repr(_other_value(default))])
    with pytest.raises(ConfigError, match=rf"^{key} is .*not supported here and must keep its default"):
        validate_cfg(cfg)


def test_unsupported_keys_at_their_default_are_accepted(tmp_path):
    path = tmp_path / "dassl_style.yaml"
    path.write_text(textwrap.dedent("""\
        VERSION: 1
        DATASET:
          VAL_PERCENT: 0.1
          NUM_LABELED: -1
        MODEL:
          BACKBONE:
            PRETRAINED: True
          HEAD:
            HIDDEN_LAYERS: []
        TRAIN:
          COUNT_ITER: train_x
        """))
    cfg = merged_defaults()
    merge_from_file(cfg, str(path))
    validate_cfg(cfg)


def test_scan_rules(tmp_path):
    """The scan counts loads through chains, lookups, aliases and parameters, not assignments
    or an ambiguous last name alone."""
    (tmp_path / "vlprompt").mkdir()
    (tmp_path / "vlprompt" / "reader.py").write_text(textwrap.dedent("""\
        def define(cfg):
            cfg.NODE.DEFINED_ONLY = 3

        def use(cfg, other):
            optim = cfg.OPTIM
            print(optim.LR, cfg.MODEL["SIZE"], cfg.MODEL.get("DEPTH"), other.NAME)
            helper(cfg.DATA)
            node = cfg.TRAINER[cfg.TRAINER.NAME]
            return node.N_CTX

        def helper(data_cfg):
            return data_cfg.ROOT
        """))
    cfg = CN()
    cfg.OPTIM = CN({"LR": 0.1, "NAME": "sgd"})
    cfg.MODEL = CN({"SIZE": 1, "DEPTH": 2, "NAME": "m"})
    cfg.DATA = CN({"ROOT": "", "UNUSED": 0})
    cfg.NODE = CN({"DEFINED_ONLY": 0})
    cfg.TRAINER = CN({"NAME": "", "A": CN({"N_CTX": 1, "OTHER": 2}), "B": CN({"N_CTX": 1})})
    assert unread_keys(cfg, root=tmp_path) == [
        "OPTIM.NAME", "MODEL.NAME", "DATA.UNUSED", "NODE.DEFINED_ONLY", "TRAINER.A.OTHER",
    ]
