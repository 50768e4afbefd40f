"""Every registered trainer predicts and exports (a new trainer is covered without a test of its own):
on a 1-epoch run of the toy OxfordPets with the tiny synthetic CLIP, ``load_run(RUN).predict`` scores
images; other class names (``classes=``) are scored or refused with the trainer's declared reason;
``export_run`` writes a file that ``load_exported`` loads and that predicts what the run predicts,
or (``export_refusal`` on the trainer class) is refused with the declared reason, by tools/export.py
with exit status 2. Zero-shot CLIP's run is its ``--eval-only`` folder.

A test-time method (TPT, RAdaTTT, PromptAlign) predicts and exports from a training run of the
method it adapts (``test_time=``), as ``tools/predict.py --test-time`` does. Runs are trained once
per module and shared by the tests that need them."""
import json
import os
import re

import pytest
from clip_loads import shared_clip_loads  # noqa: F401  (the module's fixture)
from test_predict import ROOT, TPT_VIEWS, run_test_split, run_train

from vlprompt.config import ConfigError
from vlprompt.engine import TRAINER_REGISTRY, test_time
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES
from vlprompt_app import load_run
from vlprompt_app.commands import export as export_command
from vlprompt_app.export import export_run, load_exported
from vlprompt_app.project import import_project, registered_trainer_names

import_project()
NAMES = registered_trainer_names()  # the project's trainers (other tests register toy ones in this process)

# Trainers whose synthetic config is not configs/trainers/<name>/synthetic.yaml.
CONFIGS = {
    "ZeroshotCLIP": "CoOp/synthetic.yaml",  # as the CoOp scripts evaluate zero-shot CLIP
    "ZeroshotCLIP2": "CoOp/synthetic.yaml",
    "LPFT": "LPFT/synthetic_stage1.yaml",
    "RAdaFFT": "RAdaFFT/synthetic_stage1.yaml",
}
# A test-time method adapts a trained run: (the trainer of that run, the method's config, overrides).
TEST_TIME_SOURCES = {
    "TPT": ("CoOp", "TPT/synthetic.yaml", TPT_VIEWS),
    "RAdaTTT": ("RAda", "RAdaTTT/synthetic.yaml", ("TRAINER.RADATTT.NUM_VIEWS", "4")),
    "PromptAlign": ("MaPLe", "PromptAlign/synthetic.yaml", TPT_VIEWS),
}
# What the toy OxfordPets needs beyond a synthetic config (its template "a photo of a {}, a type of
# pet." and upstream's two-token OxfordPets attribute word do not fit them; ATPrompt's file is
# written by the data_root fixture).
OPTS = {
    "ProGrad": ("TRAINER.PROGRAD.N_CTX", "8"),
    "ATPrompt": ("TRAINER.ATPROMPT.ATTRIBUTES_FILE", "{data}/atprompt_attributes.yaml"),
}
OTHER_CLASSES = ["red circle", "blue square", "green star"]
pytestmark = pytest.mark.usefixtures("shared_clip_loads")  # the synthetic CLIP is read once


def is_test_time(name):
    return issubclass(TRAINER_REGISTRY.get(name), test_time.TestTimeTrainer)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """The toy OxfordPets, with the class descriptions TAC trains from (``descriptions/``)."""
    from vlprompt.testing import write_oxford_pets_tree

    root = tmp_path_factory.mktemp("all_trainers_data")
    write_oxford_pets_tree(str(root), train=4, val=1, test=1)
    names = [name.replace("_", " ").lower() for name in OXFORD_PETS_TOY_CLASSES]
    (root / "descriptions").mkdir()
    (root / "descriptions" / "oxford_pets_prompt.json").write_text(
        json.dumps({name: [f"a photo of a {name}.", f"a {name}, a type of pet."] for name in names}))
    (root / "atprompt_attributes.yaml").write_text("OxfordPets: [color, shape]\n")
    return str(root)


@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """``runs(name)``: the folder of a 1-epoch run of trainer ``name`` (trained on first use)."""
    folders = {}
    base = tmp_path_factory.mktemp("all_trainers_runs")

    def run(name):
        if name not in folders:
            folder = base / name
            extra = tuple(value.format(data=data_root) for value in OPTS.get(name, ()))
            if name == "PromptKD":
                extra = ("TRAINER.PROMPTKD.TEACHER_DIR", str(run("PromptSRC")))
            if name in ("ZeroshotCLIP", "ZeroshotCLIP2"):
                extra = ("--eval-only",)  # learns nothing: its evaluation is its run
            cwd = os.getcwd()
            os.chdir(ROOT)
            try:
                run_train(data_root, name, CONFIGS.get(name, f"{name}/synthetic.yaml"), folder, *extra)
            finally:
                os.chdir(cwd)
            folders[name] = folder
        return folders[name]

    return run


def predictor_of(name, runs, **kwargs):
    """load_run of trainer ``name``'s run (a test-time method: of its source run, adapted)."""
    if is_test_time(name):
        source, config, opts = TEST_TIME_SOURCES[name]
        return load_run(runs(source), test_time=name, test_time_config=f"configs/trainers/{config}", opts=opts,
                        **kwargs)
    return load_run(runs(name), **kwargs)


@pytest.fixture(scope="module")
def toy_test_paths(runs, data_root):
    """``toy_test_paths(name)``: the test images of the toy OxfordPets, from the dataset of trainer
    ``name``'s run (or source run), read once and shared by the two tests of a trainer."""
    paths = {}

    def test_paths(name):
        source = TEST_TIME_SOURCES[name][0] if is_test_time(name) else name
        if source not in paths:
            paths[source] = [item.impath for item in run_test_split(runs(source), data_root)]
        return list(paths[source])

    return test_paths


@pytest.fixture(scope="module")
def predictors(runs):
    """``predictors(name)``: ``predictor_of(name, runs)`` with the run's own classes, loaded on first
    use and shared by the two tests of a trainer (predicting changes nothing in it)."""
    loaded = {}

    def predictor(name):
        if name not in loaded:
            cwd = os.getcwd()
            os.chdir(ROOT)
            try:
                loaded[name] = predictor_of(name, runs)
            finally:
                os.chdir(cwd)
        return loaded[name]

    return predictor


def test_every_test_time_method_has_a_source():
    assert sorted(TEST_TIME_SOURCES) == sorted(name for name in NAMES if is_test_time(name))


def test_declared_refusals_are_sentences_without_a_final_stop():
    """The reasons are completed by the messages ("... cannot be exported: REASON.")."""
    declared = [(name, getattr(TRAINER_REGISTRY.get(name), attribute, ""))
                for name in NAMES for attribute in ("export_refusal", "unseen_classes_refusal")]
    assert "PromptAlign" in {name for name in NAMES if getattr(TRAINER_REGISTRY.get(name), "export_refusal", "")}
    for name, reason in declared:
        assert isinstance(reason, str) and reason == reason.strip() and not reason.endswith("."), name


@pytest.mark.e2e
@pytest.mark.parametrize("name", NAMES)
def test_load_run_predicts_and_other_classes_are_scored_or_refused(name, runs, predictors, toy_test_paths, monkeypatch):
    monkeypatch.chdir(ROOT)
    predictor = predictors(name)
    assert predictor.cfg.TRAINER.NAME == name and predictor.classnames == predictor.trainer.dm.dataset.classnames
    paths = toy_test_paths(name)
    assert paths
    predictions = predictor.predict(paths, topk=2)
    assert [p.source for p in predictions] == paths
    for p in predictions:
        assert not p.error and len(p.labels) == 2 and set(p.labels) <= set(predictor.classnames)
        assert p.probabilities[0] >= p.probabilities[1] > 0

    reason = TRAINER_REGISTRY.get(name).unseen_classes_refusal
    if reason:
        with pytest.raises(ConfigError, match=f"^{name} cannot score class names other than those it was trained on"):
            predictor_of(name, runs, classes=OTHER_CLASSES)
        return
    other = predictor_of(name, runs, classes=OTHER_CLASSES)
    assert other.cfg.TEST.ROLE == "new" and other.classnames == OTHER_CLASSES
    (prediction,) = other.predict(paths[:1], topk=3)
    assert sorted(prediction.labels) == sorted(OTHER_CLASSES)
    assert sum(prediction.probabilities) == pytest.approx(1.0, abs=1e-5)


def export_of(name, runs, output):
    """export_run of trainer ``name``'s run (a test-time method: of its source run, adapted)."""
    if is_test_time(name):
        source, config, opts = TEST_TIME_SOURCES[name]
        return export_run(runs(source), output, test_time=name, test_time_config=f"configs/trainers/{config}",
                          opts=opts)
    return export_run(runs(name), output)


@pytest.mark.e2e
@pytest.mark.parametrize("name", NAMES)
def test_export_loads_and_predicts_as_the_run_or_is_refused(name, runs, predictors, toy_test_paths, tmp_path,
                                                            monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    reason = getattr(TRAINER_REGISTRY.get(name), "export_refusal", "")
    if reason:
        with pytest.raises(ConfigError, match=f"^{name} cannot be exported: {re.escape(reason)}"):
            export_of(name, runs, tmp_path / "model.pt")
        source, config, _ = TEST_TIME_SOURCES.get(name, (name, "", ()))
        argv = [str(runs(source)), "--output", str(tmp_path / "model.pt")]
        if is_test_time(name):
            argv += ["--test-time", name, "--test-time-config", f"configs/trainers/{config}"]
        capsys.readouterr()
        assert export_command.main(argv) == 2
        assert capsys.readouterr().err == f"Error: {name} cannot be exported: {reason}.\n"
        assert not (tmp_path / "model.pt").exists()
        return
    predictor = predictors(name)
    paths = toy_test_paths(name)
    record = export_of(name, runs, tmp_path / "model.pt")
    assert record["trainer"] == name
    kind = "cosine" if getattr(TRAINER_REGISTRY.get(name), "exports_class_text_features", False) else "trainer"
    assert record["head"]["kind"] == kind
    exported = load_exported(tmp_path / "model.pt")
    assert exported.classnames == predictor.classnames
    mine, theirs = exported.predict(paths, topk=2), predictor.predict(paths, topk=2)
    assert [p.labels for p in mine] == [p.labels for p in theirs]
    for a, b in zip(mine, theirs):
        assert a.probabilities == pytest.approx(b.probabilities, abs=1e-4)
