"""train.py's pre-flight checks: bad files named by the config or the command line (--model-dir, its
trainer, TAC's descriptions) end with one paragraph and exit status 2 before the trainer is built
(so before any data or CLIP loads), and the errors found later (a checkpoint that is not there,
descriptions lacking classes, an unreadable run-folder file) exit with status 2 too."""
from pathlib import Path

import pytest

import vlprompt.engine
from trainers.coop import CoOp
from vlprompt.config import get_cfg_default
from vlprompt.data.descriptions import DescriptionsError
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.checkpointing import ModelNotFoundError
from vlprompt.engine.run_folder import RunFolder, RunFolderError
from vlprompt.utils import close_logger
from vlprompt_app.commands import train

ROOT = Path(__file__).resolve().parents[1]


class NotBuilt(Exception):
    """Raised instead of building the trainer: the run got past its pre-flight checks."""


@pytest.fixture
def unbuilt(monkeypatch):
    """build_trainer raises NotBuilt: an error that comes first came before any data or CLIP loaded."""
    def refuse(cfg):
        raise NotBuilt

    monkeypatch.setattr(vlprompt.engine, "build_trainer", refuse)


def _argv(tiny_clip_files, output_dir, trainer, config, *extra):
    config_file, weights = tiny_clip_files
    return ["--root", "/nonexistent/data", "--trainer", trainer, "--output-dir", str(output_dir),
            "--dataset-config-file", str(ROOT / "configs/datasets/synthetic_shapes.yaml"),
            "--config-file", str(ROOT / "configs/trainers" / trainer / f"{config}.yaml"), *extra,
            "MODEL.BACKBONE.NAME", config_file, "MODEL.BACKBONE.WEIGHTS", weights]


def _run_of(folder, trainer):
    """A run folder whose config.yaml says it is a ``trainer`` run."""
    cfg = get_cfg_default()
    cfg.TRAINER.NAME = trainer
    RunFolder(folder).path.mkdir(parents=True)
    RunFolder(folder).write_config(cfg)
    return str(folder)


def _refused(capsys, argv):
    assert train.run(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.split())


def test_a_model_dir_that_does_not_exist_is_refused_before_anything_loads(unbuilt, tiny_clip_files, tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    err = _refused(capsys, _argv(tiny_clip_files, tmp_path / "out", "CoOp", "synthetic", "--eval-only",
                                 "--model-dir", str(missing)))
    assert f'--model-dir "{missing}" does not exist' in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config, source, expected", [
    ("synthetic_maple", "CoOp", "MaPLe"),  # TPT:synthetic_maple given a CoOp run
    ("synthetic", "KgCoOp", "CoOp"),  # TPT:synthetic (a CoOp prompt) given a run of another trainer
])
def test_tpt_refuses_a_source_run_of_another_trainer_naming_both(unbuilt, tiny_clip_files, tmp_path, capsys,
                                                                  config, source, expected):
    run = _run_of(tmp_path / "source", source)
    err = _refused(capsys, _argv(tiny_clip_files, tmp_path / "out", "TPT", config, "--eval-only", "--model-dir", run))
    assert (f'--model-dir "{run}" is a {source} run ({run}/config.yaml), but TPT with this config starts from a run '
            f"of {expected}") in err


def test_tpt_names_the_source_run_it_accepts_a_subclass_included(unbuilt, tiny_clip_files, tmp_path, capsys):
    if "CoOpUnderAnotherName" not in TRAINER_REGISTRY.registered_names():
        TRAINER_REGISTRY.register()(type("CoOpUnderAnotherName", (CoOp,), {}))
    for trainer in ("CoOp", "CoOpUnderAnotherName"):
        run = _run_of(tmp_path / trainer, trainer)
        try:
            with pytest.raises(NotBuilt):
                train.run(_argv(tiny_clip_files, tmp_path / f"out_{trainer}", "TPT", "synthetic", "--eval-only",
                                "--model-dir", run))
        finally:
            close_logger()  # the run set up its log before the trainer was built
        assert f'Model folder: "{run}", a {trainer} run' in capsys.readouterr().out


def test_tac_refuses_missing_or_malformed_descriptions_before_anything_loads(unbuilt, tiny_clip_files, tmp_path,
                                                                              capsys):
    folder = tmp_path / "descriptions"
    argv = _argv(tiny_clip_files, tmp_path / "out", "TAC", "basetonovel", "DATASET.NAME", "OxfordPets",
                 "TRAINER.TAC.DESCRIPTIONS", str(folder))
    assert f"{folder}/oxford_pets_prompt.json does not exist" in _refused(capsys, argv)
    folder.mkdir()
    (folder / "oxford_pets_prompt.json").write_text('{"abyssinian": ["a cat"')
    assert "Cannot read the descriptions file" in _refused(capsys, argv)


@pytest.mark.parametrize("error", [
    ModelNotFoundError('Model not found at "run/MultiModalPromptLearner/model.pth.tar-2"'),
    DescriptionsError("descriptions/imagenet_prompt.json has no descriptions for 79 of the 80 classes"),
    RunFolderError("test_time/test.json is not readable JSON"),
])
def test_errors_found_after_loading_are_bad_input_too(error):
    assert train.error_exit_status(error) == 2


def test_a_missing_checkpoint_is_still_a_file_not_found_error():
    assert issubclass(ModelNotFoundError, FileNotFoundError)  # what load_model raised before
