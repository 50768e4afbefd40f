"""The rerun rule (vlprompt/engine/rerun.py): a run into a folder that holds checkpoints compares
the merged config it is asked to run with the folder's config.yaml, keys that cannot change the
result aside, and refuses a difference before writing anything; --restart moves the folder's
files aside and starts afresh. (The protocol runner's side is in tests/test_run_protocol.py.)

train.py runs in this process: CoOp on a miniature OxfordPets tree with the session's tiny CLIP,
trained once for two epochs and copied for each test.
"""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.engine.rerun import NEUTRAL_KEYS, SettingsChangedError, check_rerun, settings_differences
from vlprompt.engine.run_folder import RunFolder
from vlprompt.engine.run_lock import LOCK_FILENAME
from vlprompt.testing import write_oxford_pets_tree
from vlprompt.utils import close_logger
from vlprompt_app.commands import train
from vlprompt_app.results import find_runs

ROOT = Path(__file__).resolve().parents[1]


def argv(data, clip, output_dir, *flags, opts=()):
    """train.py arguments: CoOp's toy config (OPTIM.LR 0.05), 2 epochs; ``flags`` go before the
    KEY VALUE pairs, ``opts`` after them."""
    config, weights = clip
    return ["--root", str(data), "--trainer", "CoOp", "--seed", "1",
            "--dataset-config-file", str(ROOT / "configs/datasets/oxford_pets.yaml"),
            "--config-file", str(ROOT / "configs/trainers/CoOp/toy.yaml"), "--output-dir", str(output_dir), *flags,
            "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, "OPTIM.MAX_EPOCH", "2", *opts]


def run_train(arguments, capsys):
    """(exit status, stdout, stderr) of train.py run in this process."""
    try:
        status = train.run(arguments)
    finally:
        close_logger()
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def snapshot(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_clip_files):
    """(data root, finished run folder): two epochs of CoOp at the toy config's OPTIM.LR 0.05."""
    base = tmp_path_factory.mktemp("rerun")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=2)
    try:
        status = train.run(argv(base / "data", tiny_clip_files, base / "run"))
    finally:
        close_logger()
    assert status == 0 and RunFolder(base / "run").completed
    return base / "data", base / "run"


@pytest.fixture
def run_copy(trained, tmp_path):
    shutil.copytree(trained[1], tmp_path / "run")
    return tmp_path / "run"


def test_a_rerun_with_other_settings_is_refused_before_anything_is_written(trained, run_copy, tiny_clip_files,
                                                                          capsys):
    before = snapshot(run_copy)
    status, out, err = run_train(argv(trained[0], tiny_clip_files, run_copy,
                                      opts=("OPTIM.LR", "0.5", "OPTIM.MAX_EPOCH", "3")), capsys)
    assert status == 2, out[-2000:] + err[-2000:]
    assert err.startswith("\nError: ") and err.count("\n") == 2 and "Traceback" not in err  # one paragraph
    assert f'"{run_copy}" holds checkpoints of a run with other settings' in err
    assert "OPTIM.LR 0.05 -> 0.5; OPTIM.MAX_EPOCH 2 -> 3." in err
    assert "another --output-dir, or add --restart" in err and "replaced-<date-time>/" in err
    assert snapshot(run_copy) == before  # config.yaml still records the run that is there; no log, no lock
    assert "RESUMING" not in out and "Loading CLIP" not in out


@pytest.mark.e2e
def test_a_moved_folder_and_changes_that_cannot_change_the_result_go_on(trained, run_copy, tiny_clip_files, capsys):
    """The copy is another OUTPUT_DIR; workers, print frequency and evaluation batch size are neutral."""
    status, out, err = run_train(argv(trained[0], tiny_clip_files, run_copy, opts=(
        "DATALOADER.NUM_WORKERS", "0", "TRAIN.PRINT_FREQ", "3", "DATALOADER.TEST.BATCH_SIZE", "5")), capsys)
    assert status == 0, err[-2000:]
    assert "** All 2 epochs are already done (checkpoint of epoch 2)" in out
    recorded = yaml.safe_load((run_copy / "config.yaml").read_text())
    assert recorded["OUTPUT_DIR"] == str(run_copy) and recorded["TRAIN"]["PRINT_FREQ"] == 3  # what this run used
    original = json.loads((trained[1] / "results.json").read_text())["metrics"]
    assert json.loads((run_copy / "results.json").read_text())["metrics"] == original


@pytest.mark.e2e
def test_restart_moves_the_earlier_run_aside_and_trains_afresh(trained, run_copy, tiny_clip_files, capsys):
    (run_copy / "console.txt").write_text("the protocol runner's attempts\n")
    status, out, err = run_train(argv(trained[0], tiny_clip_files, run_copy, "--restart", opts=("OPTIM.LR", "0.5")),
                                 capsys)
    assert status == 0, err[-2000:]
    (aside,) = [p for p in run_copy.iterdir() if p.name.startswith("replaced-")]
    assert f'Starting afresh (--restart): the files of the earlier run in "{run_copy}" were moved into {aside}' in out
    assert "RESUMING" not in out and "epoch [1/2]" in out
    assert snapshot(aside) == snapshot(trained[1])  # the earlier run, whole
    assert yaml.safe_load((run_copy / "config.yaml").read_text())["OPTIM"]["LR"] == 0.5
    assert (run_copy / "console.txt").read_text() == "the protocol runner's attempts\n"  # left in place
    assert sorted(p.name for p in run_copy.iterdir()) == sorted(
        ["classes.json", "config.yaml", "console.txt", "log.txt", "prompt_learner", "results.json", "tensorboard",
         aside.name])
    assert [run.path for run in find_runs(run_copy)] == [run_copy]  # the aside folder is not a run of its own


def test_restart_refuses_a_command_it_contradicts(tmp_path):
    cfg = SimpleNamespace(RESUME=str(tmp_path / "other"), OUTPUT_DIR=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"--restart starts .*run afresh, but RESUME \(.*other\) asks to resume"):
        train.check_restart(SimpleNamespace(eval_only=False, model_dir=""), cfg)
    cfg.RESUME = ""
    evaluation = SimpleNamespace(eval_only=True, model_dir=str(tmp_path / "run" / "."))
    with pytest.raises(ConfigError, match="--restart would move the model this run evaluates"):
        train.check_restart(evaluation, cfg)
    train.check_restart(SimpleNamespace(eval_only=True, model_dir=str(tmp_path / "model")), cfg)


@pytest.mark.e2e
def test_an_evaluation_of_a_model_dir_records_its_settings_apart(trained, tiny_clip_files, tmp_path, capsys):
    evaluation = tmp_path / "eval"
    status, _, err = run_train(argv(trained[0], tiny_clip_files, evaluation, "--eval-only", "--model-dir",
                                    str(trained[1]), "--load-epoch", "2"), capsys)
    assert status == 0, err[-2000:]
    assert not (evaluation / "config.yaml").exists()  # not a model: tools/predict.py does not take it for one
    assert yaml.safe_load((evaluation / "eval_config.yaml").read_text())["OUTPUT_DIR"] == str(evaluation)


# ------------------------------------------------------------------------- the comparison


def test_neutral_keys_and_keys_the_record_lacks():
    recorded = {"OUTPUT_DIR": "a", "DATALOADER": {"NUM_WORKERS": 4, "TEST": {"BATCH_SIZE": 32}},
                "OPTIM": {"LR": 0.002, "MAX_EPOCH": 3}, "TRAINER": {"GONE": 1}}
    requested = {"OUTPUT_DIR": "b", "DATALOADER": {"NUM_WORKERS": 0, "TEST": {"BATCH_SIZE": 100}},
                 "OPTIM": {"LR": 0.002, "MAX_EPOCH": 5}, "TRAINER": {"NEW": {"A": 1, "B": 2}}}
    defaults = {"TRAINER": {"NEW": {"A": 1, "B": 0}}}
    found = [str(d) for d in settings_differences(recorded, requested, defaults)]
    # a key added later counts only when it leaves its default; a key that is gone is listed
    assert found == ["OPTIM.MAX_EPOCH 3 -> 5", "TRAINER.GONE 1 -> (no such key)", "TRAINER.NEW.B (no such key) -> 2"]
    assert all(reason for reason in NEUTRAL_KEYS.values())


def test_move_aside_leaves_the_lock_the_console_and_earlier_replacements(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.move_aside() is None  # nothing to move
    for name in ("config.yaml", LOCK_FILENAME, "console.txt", "replaced-2020-01-01-00-00-00/log.txt", "m/model.pth.tar-1"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    assert folder.holds_checkpoints()
    aside = folder.move_aside()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [LOCK_FILENAME, "console.txt", "replaced-2020-01-01-00-00-00", aside.name])
    assert sorted(p.relative_to(aside).as_posix() for p in aside.rglob("*") if p.is_file()) == [
        "config.yaml", "m/model.pth.tar-1"]
    assert not folder.holds_checkpoints()


def test_what_a_run_would_reuse_decides_what_is_compared(tmp_path):
    """An evaluation resumes only a test-time method's per-image records (checked against
    eval_config.yaml); a folder of an earlier version, without a record, resumes with a note."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.OUTPUT_DIR = str(tmp_path)
    other = cfg.clone()
    other.TEST.SPLIT, other.DATALOADER.NUM_WORKERS = "val", 0
    RunFolder(tmp_path).write_config(cfg, evaluation=True)
    assert check_rerun(other, training=False, evaluation=True) == []  # nothing to reuse yet
    (tmp_path / "test_time").mkdir()
    (tmp_path / "test_time" / "test.json").write_text("{}")
    with pytest.raises(SettingsChangedError, match=r"holds the per-image records of a test-time evaluation of a "
                                                   r"run with other settings .*eval_config.yaml\): TEST.SPLIT 'test' -> 'val'\."):
        check_rerun(other, training=False, evaluation=True)
    assert check_rerun(cfg, training=False, evaluation=True) == []
    (tmp_path / "eval_config.yaml").unlink()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.pth.tar-1").write_text("")
    assert check_rerun(other, training=True, evaluation=False)[0].startswith(
        f'Note: "{tmp_path}" holds checkpoints but no config.yaml')
