"""train.py's grammar: options first, then KEY VALUE overrides, and
unsupported keys rejected before anything is built. All fail before any data is read."""
import shlex

import pytest

from vlprompt_app.commands import train
from vlprompt.config import ConfigError, get_cfg_default, merge_from_list

BASE = ["--trainer", "CoOp", "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
        "--config-file", "configs/trainers/CoOp/toy.yaml", "--root", "/nonexistent/data"]


def check(argv):
    parser = train.build_parser()
    train.check_option_order(parser, argv, parser.parse_args(argv).opts)


def error_of(argv, capsys):
    assert train.run(argv) == 2
    return capsys.readouterr().err


def test_option_after_overrides_is_named_with_the_reordered_command(capsys):
    err = error_of([*BASE, "DATASET.NUM_SHOTS", "16", "--output-dir", "out dir"], capsys)
    assert "Unknown config key" not in err
    assert "--output-dir is an option of train.py, but came after the KEY VALUE overrides" in err
    assert "Options must come before the KEY VALUE overrides" in err
    expected = "python train.py " + " ".join(BASE) + " --output-dir 'out dir' DATASET.NUM_SHOTS 16"
    assert expected in err


def test_several_misplaced_options_with_switches_and_lists_are_all_moved(capsys):
    argv = [*BASE, "DATASET.NUM_SHOTS", "16", "--eval-only", "--transforms", "random_flip", "normalize",
            "OPTIM.LR", "0.1", "--seed=2"]
    err = error_of(argv, capsys)
    assert "--eval-only, --transforms, --seed are options of train.py" in err
    assert ("python train.py --transforms random_flip normalize " + " ".join(BASE) + " --eval-only --seed=2 "
            "DATASET.NUM_SHOTS 16 OPTIM.LR 0.1") in err


def test_reordered_command_parses_as_intended():
    argv = [*BASE, "DATASET.NUM_SHOTS", "16", "--output-dir", "X", "--transforms", "a", "b", "OPTIM.LR", "0.1"]
    with pytest.raises(ConfigError) as error:
        check(argv)

    fixed = shlex.split(str(error.value).split("python train.py ", 1)[1])
    assert fixed[:3] == ["--transforms", "a", "b"]
    args = train.build_parser().parse_args(fixed)
    assert (args.output_dir, args.transforms) == ("X", ["a", "b"])
    assert args.opts == ["DATASET.NUM_SHOTS", "16", "OPTIM.LR", "0.1"]
    check(fixed)


def test_negative_values_are_not_options():
    check([*BASE, "SEED", "-1", "OPTIM.WARMUP_EPOCH", "-1"])


@pytest.mark.parametrize("opts, expected", [
    (["DATASET.NUM_SHOTS", "16", "--outptu-dir", "X"], '"--outptu-dir" is not a config key: it looks like a command-line option'),
    (["DATASET.NUM_SHOTS", "16", "--bogus"], "--bogus looks like a command-line option"),
])
def test_merge_from_list_names_option_like_items(opts, expected):
    with pytest.raises(ConfigError, match="Options must come before the KEY VALUE overrides") as error:
        merge_from_list(get_cfg_default(), opts)
    assert expected in str(error.value)


def test_head_flag_is_rejected_as_unsupported(capsys):
    err = error_of([*BASE, "--head", "mlp"], capsys)
    assert "MODEL.HEAD.NAME is 'mlp', but this key is not supported here" in err
    assert "SimpleNet" in err
