"""Config defaults, extensions, and yacs-semantics merging with readable errors."""
import pytest
from yacs.config import CfgNode

import vlprompt.config as config_module
from vlprompt.config import (
    ConfigError,
    clean_cfg,
    extend_cfg,
    get_cfg_default,
    merge_from_file,
    merge_from_list,
    register_cfg_extension,
)

# Dassl 0.6.3's defaults + SUBSAMPLE_CLASSES + the project keys.
EXPECTED_DEFAULTS = {
    "VERSION": 1,
    "OUTPUT_DIR": "./output",
    "RESUME": "",
    "SEED": -1,
    "USE_CUDA": True,
    "VERBOSE": True,
    "INPUT.SIZE": (),  # the preprocessing keys: empty = the backbone's (Dassl's values without one)
    "INPUT.INTERPOLATION": "",
    "INPUT.TRANSFORMS": (),
    "INPUT.NO_TRANSFORM": False,
    "INPUT.PIXEL_MEAN": [],
    "INPUT.PIXEL_STD": [],
    "INPUT.RESIZE_MODE": "",
    "INPUT.CROP_PADDING": 4,
    "INPUT.RRCROP_SCALE": (0.08, 1.0),
    "INPUT.CUTOUT_N": 1,
    "INPUT.CUTOUT_LEN": 16,
    "INPUT.GN_MEAN": 0.0,
    "INPUT.GN_STD": 0.15,
    "INPUT.RANDAUGMENT_N": 2,
    "INPUT.RANDAUGMENT_M": 10,
    "INPUT.COLORJITTER_B": 0.4,
    "INPUT.COLORJITTER_C": 0.4,
    "INPUT.COLORJITTER_S": 0.4,
    "INPUT.COLORJITTER_H": 0.1,
    "INPUT.RGS_P": 0.2,
    "INPUT.GB_P": 0.5,
    "INPUT.GB_K": 21,
    "DATASET.ROOT": "",
    "DATASET.NAME": "",
    "DATASET.SOURCE_DOMAINS": (),
    "DATASET.TARGET_DOMAINS": (),
    "DATASET.NUM_LABELED": -1,
    "DATASET.NUM_SHOTS": -1,
    "DATASET.VAL_PERCENT": 0.1,
    "DATASET.STL10_FOLD": -1,
    "DATASET.CIFAR_C_TYPE": "",
    "DATASET.CIFAR_C_LEVEL": 1,
    "DATASET.ALL_AS_UNLABELED": False,
    "DATASET.SUBSAMPLE_CLASSES": "all",
    "DATASET.CHECK_IMAGES": "verify",
    "DATASET.SKIP_BAD_IMAGES": False,
    "DATASET.CACHE_DIR": "",
    "DATASET.IMAGE_FOLDER.DIR": "",
    "DATASET.IMAGE_FOLDER.LAYOUT": "auto",
    "DATASET.IMAGE_FOLDER.LIST_FILE": "",
    "DATASET.IMAGE_FOLDER.CLASSNAMES_FILE": "",
    "DATASET.IMAGE_FOLDER.SPLIT_FILE": "split_zhou_ImageFolder.json",
    "DATASET.IMAGE_FOLDER.SPLIT_RATIO": (0.5, 0.2, 0.3),
    "DATASET.IMAGE_FOLDER.SPLIT_SEED": 1,
    "DATASET.IMAGE_FOLDER.TEMPLATE": "a photo of a {}.",
    "DATALOADER.NUM_WORKERS": 4,
    "DATALOADER.K_TRANSFORMS": 1,
    "DATALOADER.RETURN_IMG0": False,
    "DATALOADER.TRAIN_X.SAMPLER": "RandomSampler",
    "DATALOADER.TRAIN_X.BATCH_SIZE": 32,
    "DATALOADER.TRAIN_X.N_DOMAIN": 0,
    "DATALOADER.TRAIN_X.N_INS": 16,
    "DATALOADER.TRAIN_U.SAME_AS_X": True,
    "DATALOADER.TRAIN_U.SAMPLER": "RandomSampler",
    "DATALOADER.TRAIN_U.BATCH_SIZE": 32,
    "DATALOADER.TRAIN_U.N_DOMAIN": 0,
    "DATALOADER.TRAIN_U.N_INS": 16,
    "DATALOADER.TEST.SAMPLER": "SequentialSampler",
    "DATALOADER.TEST.BATCH_SIZE": 32,
    "MODEL.INIT_WEIGHTS": "",
    "MODEL.BACKBONE.NAME": "",
    "MODEL.BACKBONE.PRETRAINED": True,
    "MODEL.BACKBONE.WEIGHTS": "",
    "MODEL.HEAD.NAME": "",
    "MODEL.HEAD.HIDDEN_LAYERS": (),
    "MODEL.HEAD.ACTIVATION": "relu",
    "MODEL.HEAD.BN": True,
    "MODEL.HEAD.DROPOUT": 0.0,
    "OPTIM.NAME": "adam",
    "OPTIM.LR": 0.0003,
    "OPTIM.WEIGHT_DECAY": 5e-4,
    "OPTIM.MOMENTUM": 0.9,
    "OPTIM.SGD_DAMPNING": 0,
    "OPTIM.SGD_NESTEROV": False,
    "OPTIM.RMSPROP_ALPHA": 0.99,
    "OPTIM.ADAM_BETA1": 0.9,
    "OPTIM.ADAM_BETA2": 0.999,
    "OPTIM.STAGED_LR": False,
    "OPTIM.NEW_LAYERS": (),
    "OPTIM.BASE_LR_MULT": 0.1,
    "OPTIM.LR_SCHEDULER": "single_step",
    "OPTIM.STEPSIZE": (-1,),
    "OPTIM.GAMMA": 0.1,
    "OPTIM.MAX_EPOCH": 10,
    "OPTIM.WARMUP_EPOCH": -1,
    "OPTIM.WARMUP_TYPE": "linear",
    "OPTIM.WARMUP_CONS_LR": 1e-5,
    "OPTIM.WARMUP_MIN_LR": 1e-5,
    "OPTIM.WARMUP_RECOUNT": True,
    "TRAIN.CHECKPOINT_FREQ": 0,
    "TRAIN.PRINT_FREQ": 10,
    "TRAIN.COUNT_ITER": "train_x",
    "TRAIN.SAVE_FROZEN_WEIGHTS": False,
    "TRAIN.CHECKPOINT_ITERS": 0,
    "TRAIN.NONFINITE_LOSS": "stop",
    "TRAIN.CPU_AUTOCAST": False,
    "TRAIN.COMPILE": "",
    "FEATURE_CACHE.ENABLED": False,
    "FEATURE_CACHE.DIR": "",
    "FEATURE_CACHE.BATCH_SIZE": 256,
    "TEST.EVALUATOR": "Classification",
    "TEST.PER_CLASS_RESULT": False,
    "TEST.COMPUTE_CMAT": False,
    "TEST.NO_TEST": False,
    "TEST.SPLIT": "test",
    "TEST.FINAL_MODEL": "last_step",
    "TEST.ROLE": "",
    "TRAINER.NAME": "",
}


def _leaves(node, prefix=""):
    out = {}
    for key, value in node.items():
        if isinstance(value, CfgNode):
            out.update(_leaves(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


@pytest.fixture
def no_extensions(monkeypatch):
    """An empty extension registry for the duration of a test."""
    monkeypatch.setattr(config_module, "_CFG_EXTENSIONS", [])


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_have_exactly_the_specified_keys_values_and_types():
    leaves = _leaves(get_cfg_default())
    assert leaves == EXPECTED_DEFAULTS
    for key, value in EXPECTED_DEFAULTS.items():
        assert type(leaves[key]) is type(value), key


def test_get_cfg_default_returns_an_independent_copy():
    cfg = get_cfg_default()
    cfg.OPTIM.LR = 0.5
    cfg.TRAINER.NEW = CfgNode()
    fresh = get_cfg_default()
    assert fresh.OPTIM.LR == 0.0003
    assert "NEW" not in fresh.TRAINER


def test_freeze_blocks_assignment_and_printing_sorts_keys():
    cfg = get_cfg_default()
    cfg.freeze()
    with pytest.raises(AttributeError):
        cfg.SEED = 1
    text = str(cfg)
    top_level = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert top_level == sorted(top_level)
    assert "  LR: 0.0003" in text


def test_clean_cfg_keeps_name_and_the_trainers_node():
    cfg = get_cfg_default()
    cfg.TRAINER.COOP = CfgNode({"N_CTX": 16})
    cfg.TRAINER.COCOOP = CfgNode({"N_CTX": 16})
    clean_cfg(cfg, "CoOp")
    assert list(cfg.TRAINER.keys()) == ["NAME", "COOP"]


def test_extensions_apply_in_registration_order(no_extensions):
    calls = []

    @register_cfg_extension
    def add_first(cfg):
        calls.append("first")
        cfg.TRAINER.FIRST = CfgNode({"N_CTX": 16, "PREC": "fp16"})

    def add_second(cfg):
        calls.append("second")
        cfg.TRAINER.SECOND = CfgNode({"DEPTH": cfg.TRAINER.FIRST.N_CTX // 2})

    assert register_cfg_extension(add_second) is add_second
    cfg = get_cfg_default()
    extend_cfg(cfg)
    assert calls == ["first", "second"]
    assert cfg.TRAINER.FIRST.PREC == "fp16"
    assert cfg.TRAINER.SECOND.DEPTH == 8
    merge_from_list(cfg, ["TRAINER.FIRST.N_CTX", "4"])
    assert cfg.TRAINER.FIRST.N_CTX == 4


def test_reregistering_the_same_function_replaces_it(no_extensions):
    def add_node(cfg):
        cfg.TRAINER.X = CfgNode({"A": 1})

    register_cfg_extension(add_node)

    def add_node(cfg):  # noqa: F811 - same qualified name, as after a module re-import
        cfg.TRAINER.X = CfgNode({"A": 2})

    register_cfg_extension(add_node)
    assert len(config_module._CFG_EXTENSIONS) == 1
    cfg = get_cfg_default()
    extend_cfg(cfg)
    assert cfg.TRAINER.X.A == 2


def test_merge_from_file_literal_evaluates_and_converts_lists(tmp_path):
    path = _write(
        tmp_path,
        "method.yaml",
        "INPUT:\n  SIZE: (32, 48)\n  TRANSFORMS: [\"random_flip\", \"normalize\"]\n"
        "OPTIM:\n  NAME: \"sgd\"\n  LR: 0.002\n  WARMUP_CONS_LR: 1e-6\n  STEPSIZE: [5, 8]\n",
    )
    cfg = get_cfg_default()
    merge_from_file(cfg, path)
    assert cfg.INPUT.SIZE == (32, 48)
    assert cfg.INPUT.TRANSFORMS == ("random_flip", "normalize")
    assert cfg.OPTIM.WARMUP_CONS_LR == 1e-6 and type(cfg.OPTIM.WARMUP_CONS_LR) is float
    assert cfg.OPTIM.STEPSIZE == (5, 8)
    assert cfg.OPTIM.NAME == "sgd"


def test_merge_from_list_decodes_values_and_later_sources_win(tmp_path):
    path = _write(tmp_path, "a.yaml", "SEED: 2\nDATASET:\n  NUM_SHOTS: 4\n")
    cfg = get_cfg_default()
    merge_from_file(cfg, path)
    merge_from_list(
        cfg,
        ["SEED", "1", "USE_CUDA", "False", "DATASET.SUBSAMPLE_CLASSES", "base", "OPTIM.NEW_LAYERS", "['head']"],
    )
    assert cfg.SEED == 1
    assert cfg.USE_CUDA is False
    assert cfg.DATASET.SUBSAMPLE_CLASSES == "base"
    assert cfg.DATASET.NUM_SHOTS == 4
    assert cfg.OPTIM.NEW_LAYERS == ("head",)


def test_unknown_key_in_file_names_key_file_and_closest_keys(tmp_path):
    path = _write(tmp_path, "bad.yaml", "OPTIM:\n  LRR: 0.1\n")
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_file(cfg, path)
    message = str(info.value)
    assert message.startswith('Unknown config key "OPTIM.LRR" (from config file "')
    assert path in message
    assert "Closest existing keys: OPTIM.LR," in message
    assert "\n" not in message


def test_unknown_key_on_command_line_suggests_same_leaf_elsewhere():
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_list(cfg, ["TRAIN.LR", "0.1"])
    message = str(info.value)
    assert 'Unknown config key "TRAIN.LR" (from command line)' in message
    assert "Closest existing keys: OPTIM.LR" in message


def test_unknown_trainer_node_explains_extensions():
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_list(cfg, ["TRAINER.COOP.N_CTX", "4"])
    assert "TRAINER.COOP" in str(info.value)
    assert "extend_cfg(cfg)" in str(info.value)


def test_int_for_float_key_is_an_error_with_a_hint(tmp_path):
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_list(cfg, ["OPTIM.LR", "1"])
    assert str(info.value) == (
        'Wrong type for config key "OPTIM.LR" (from command line): expected float like the '
        "default 0.0003, but got 1 (int). Write 1.0 instead of 1."
    )
    path = _write(tmp_path, "lr.yaml", "OPTIM:\n  LR: 2\n")
    with pytest.raises(ConfigError) as info:
        merge_from_file(cfg, path)
    assert f'(from config file "{path}")' in str(info.value)
    assert "Write 2.0 instead of 2." in str(info.value)
    assert cfg.OPTIM.LR == 0.0003


@pytest.mark.parametrize(
    "key, value, expected_text, hint",
    [
        ("SEED", "1.0", "expected int like the default -1, but got 1.0 (float)", "Write 1 instead of 1.0."),
        ("USE_CUDA", "yes", "expected bool like the default True, but got 'yes' (str)", "Write True or False."),
        ("OPTIM.STEPSIZE", "20", "expected list or tuple like the default (-1,)", "[20]"),
        ("DATASET.NAME", "5", "expected str like the default '', but got 5 (int)", "Quote the value"),
        ("OPTIM", "{'LR': 1.0}", "expected a group of keys (NAME, LR,", "give a mapping of its sub-keys"),
    ],
)
def test_type_errors_name_expected_type_default_and_hint(key, value, expected_text, hint):
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_list(cfg, [key, value])
    message = str(info.value)
    assert message.startswith(f'Wrong type for config key "{key}" (from command line)')
    assert expected_text in message
    assert hint in message


def test_odd_number_of_overrides():
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_list(cfg, ["SEED", "1", "OPTIM.LR"])
    message = str(info.value)
    assert "KEY VALUE pairs" in message
    assert "odd number of items (3)" in message
    assert "['SEED', '1', 'OPTIM.LR']" in message
    assert cfg.SEED == -1  # nothing merged


def test_missing_config_file_says_how_paths_are_resolved():
    cfg = get_cfg_default()
    with pytest.raises(ConfigError) as info:
        merge_from_file(cfg, "configs/does_not_exist.yaml")
    message = str(info.value)
    assert 'Config file "configs/does_not_exist.yaml" does not exist' in message
    assert "relative to the repository root" in message
    assert "absolute path" in message
    assert isinstance(info.value, ValueError)


def test_invalid_yaml_and_non_mapping_files(tmp_path):
    cfg = get_cfg_default()
    broken = _write(tmp_path, "broken.yaml", "INPUT:\n  SIZE: [224, 224\n")
    with pytest.raises(ConfigError, match=r'Config file ".*broken.yaml" is not valid YAML: '):
        merge_from_file(cfg, broken)
    listing = _write(tmp_path, "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping of KEY: VALUE entries at the top level, but holds a list"):
        merge_from_file(cfg, listing)


def test_empty_file_merges_nothing(tmp_path):
    cfg = get_cfg_default()
    merge_from_file(cfg, _write(tmp_path, "empty.yaml", ""))
    assert cfg == get_cfg_default()


def test_star_import_exposes_config_names():
    namespace = {}
    exec("from vlprompt.config import *", namespace)
    for name in ["get_cfg_default", "clean_cfg", "register_cfg_extension", "extend_cfg",
                 "merge_from_file", "merge_from_list", "ConfigError"]:
        assert name in namespace
