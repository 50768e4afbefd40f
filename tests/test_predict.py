"""tools/predict.py and vlprompt_app.load_run: predictions of trained runs equal train.py --eval-only's
(accuracy and image by image), exported files predict the same, other class names are scored in
the new scope or refused with the method's reason, and bad input is a clear error."""
import json
import os
import re

import pytest
import torch

from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine import test_time
from vlprompt.testing import write_oxford_pets_tree
from vlprompt.utils import close_logger
from vlprompt_app import load_run
from vlprompt_app.commands import predict as predict_command
from vlprompt_app.commands import train
from vlprompt_app.export import export_run, load_exported

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("DATASET.NUM_SHOTS", "2", "OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0",
        "DATALOADER.TEST.BATCH_SIZE", "4")
TPT_VIEWS = ("TRAINER.TPT.NUM_VIEWS", "4", "TRAINER.TPT.SELECTION", "0.5")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict_data")
    write_oxford_pets_tree(str(root), train=4, val=1, test=2)
    return str(root)


def run_train(data_root, trainer, config, output_dir, *extra):
    """train.py in this process on the toy OxfordPets with a method's synthetic config (tiny CLIP);
    ``extra``: flags, then KEY VALUE pairs. Returns results.json."""
    argv = ["--root", data_root, "--trainer", trainer, "--seed", "1",
            "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
            "--config-file", f"configs/trainers/{config}", "--output-dir", str(output_dir), *extra]
    try:
        status = train.run([*argv, *TINY])
    finally:
        close_logger()
    assert status == 0
    return json.loads((output_dir / "results.json").read_text())


def eval_only_outputs(predictor):
    """(labels [N], logits [N, K]) of the trainer's own evaluation of the test split, per image."""
    trainer = predictor.trainer
    seen = []
    process = trainer.evaluator.process
    trainer.evaluator.process = lambda output, label: (seen.append((label.cpu(), output.float().cpu())),
                                                       process(output, label))
    trainer.test("test")
    trainer.evaluator.process = process
    return torch.cat([label for label, _ in seen]), torch.cat([output for _, output in seen])


def run_test_split(run, data_root):
    """The test split of the run's dataset (built from its config.yaml, reading ``data_root``)."""
    from vlprompt.data.datasets import build_dataset
    from vlprompt.engine.run_folder import RunFolder

    cfg = RunFolder(run).read_config()
    cfg.DATASET.ROOT = data_root
    return build_dataset(cfg).test


def predicted_labels(predictor, paths):
    index = {name: label for label, name in enumerate(predictor.classnames)}
    return torch.tensor([index[p.labels[0]] for p in predictor.predict(paths, topk=1)])


METHODS = [
    ("CoOp", "CoOp/synthetic.yaml", ()),
    ("MaPLe", "MaPLe/synthetic.yaml", ()),
    ("DeAR", "DeAR/synthetic.yaml", ()),
    ("RAda", "RAda/synthetic.yaml", ()),
    ("CLIPAdapter", "CLIPAdapter/synthetic.yaml", ()),
]


@pytest.mark.e2e
@pytest.mark.parametrize("trainer, config, opts", METHODS, ids=[m[0] for m in METHODS])
def test_predict_and_export_equal_eval_only_image_by_image(data_root, tmp_path, monkeypatch, request, trainer, config,
                                                           opts):
    monkeypatch.chdir(ROOT)
    if (trainer, config, opts) == METHODS[0]:  # the module's CoOp run (read, not changed, here)
        run = request.getfixturevalue("coop_run")
    else:
        run = tmp_path / "run"
        run_train(data_root, trainer, config, run, *opts)
    evaluated = run_train(data_root, trainer, config, tmp_path / "eval", "--eval-only", "--model-dir", str(run),
                          "--load-epoch", "1", *opts)
    predictor = load_run(run)  # the classes recorded by the run: no dataset is read
    from_dataset = load_run(run, root=data_root)  # the run's dataset, as eval-only builds it
    assert predictor.trainer.dm.dataset.test == [] and predictor.classnames == from_dataset.classnames
    test = from_dataset.trainer.dm.dataset.test
    paths, labels = [item.impath for item in test], torch.tensor([item.label for item in test])
    predicted = predicted_labels(predictor, paths)
    assert torch.equal(predicted_labels(from_dataset, paths), predicted)
    accuracy = 100.0 * int((predicted == labels).sum()) / len(labels)
    assert accuracy == pytest.approx(evaluated["metrics"]["accuracy"], abs=1e-9)
    test_labels, test_logits = eval_only_outputs(from_dataset)
    assert torch.equal(test_labels, labels) and torch.equal(test_logits.argmax(dim=1), predicted)

    export_run(run, tmp_path / "model.pt")
    exported = load_exported(tmp_path / "model.pt")
    assert exported.classnames == predictor.classnames
    assert torch.equal(predicted_labels(exported, paths), predicted)


@pytest.mark.e2e
def test_tpt_predictions_adapt_per_image_as_eval_only(coop_run, data_root, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    source = coop_run
    evaluated = run_train(data_root, "TPT", "TPT/synthetic.yaml", tmp_path / "tpt", "--eval-only",
                          "--model-dir", str(source), "--load-epoch", "1", *TPT_VIEWS)
    predictor = load_run(source, test_time="TPT", test_time_config="configs/trainers/TPT/synthetic.yaml",
                         opts=TPT_VIEWS)
    assert isinstance(predictor.trainer, test_time.TestTimeTrainer) and predictor.cfg.TRAINER.NAME == "TPT"
    test = run_test_split(source, data_root)
    labels = torch.tensor([item.label for item in test])
    predicted = predicted_labels(predictor, [item.impath for item in test])
    accuracy = 100.0 * int((predicted == labels).sum()) / len(labels)
    assert accuracy == pytest.approx(evaluated["metrics"]["accuracy"], abs=1e-9)


@pytest.fixture(scope="module")
def coop_run(data_root, tmp_path_factory):
    """A CoOp run (METHODS' first entry), trained once for the module's tests."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        run = tmp_path_factory.mktemp("coop") / "run"
        run_train(data_root, "CoOp", "CoOp/synthetic.yaml", run)
    finally:
        os.chdir(cwd)
    return run


def test_cli_writes_a_row_per_image_and_lists_unreadable_ones(coop_run, data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    images = os.path.join(data_root, "oxford_pets", "images")
    out = tmp_path / "preds.csv"
    assert predict_command.main([str(coop_run), images, str(bad), "--topk", "2", "--output", str(out)]) == 0
    rows = out.read_text().splitlines()
    assert rows[0] == "path,label_1,probability_1,label_2,probability_2,error"
    assert len(rows) == 1 + len(os.listdir(images)) + 1
    assert rows[-1].startswith(f"{bad},,,,,") and "broken.jpg" in rows[-1].split(",", 5)[5]
    first = rows[1].split(",")
    assert first[0].startswith(images) and float(first[2]) >= float(first[4]) > 0

    out_json = tmp_path / "preds.json"
    assert predict_command.main([str(coop_run), images, "--classes", "cat", "dog", "--output", str(out_json)]) == 0
    record = json.loads(out_json.read_text())
    assert {row["predictions"][0]["label"] for row in record} <= {"cat", "dog"} and not record[0]["error"]


def test_stdout_holds_the_csv_rows_alone(coop_run, data_root, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    images = os.path.join(data_root, "oxford_pets", "images")
    assert predict_command.main([str(coop_run), images, "--topk", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "path,label_1,probability_1,label_2,probability_2,error"
    assert len(lines) == 1 + len(os.listdir(images)) and all(line.startswith(images) for line in lines[1:])
    assert "Loading CLIP (backbone" in err and "Building transform_test" in err


def test_other_class_names_are_scored_in_the_new_scope(coop_run, monkeypatch):
    monkeypatch.chdir(ROOT)
    predictor = load_run(coop_run, classes=["red circle", "blue square", "green star"])
    assert predictor.cfg.TEST.ROLE == "new" and predictor.classnames == ["red circle", "blue square", "green star"]
    image = torch.zeros(3, 32, 32)
    (prediction,) = predictor.predict(image, topk=3)
    assert sorted(prediction.labels) == sorted(predictor.classnames)
    assert sum(prediction.probabilities) == pytest.approx(1.0, abs=1e-5)


def test_load_run_reads_no_dataset_and_logs_instead_of_printing(coop_run, data_root, tmp_path, monkeypatch, capsys,
                                                                 caplog):
    """The run's recorded classes suffice: a run whose data moved away predicts as the run with its data;
    what building prints goes to the logger vlprompt.build (quiet unless logging is configured)."""
    import logging
    import shutil

    monkeypatch.chdir(ROOT)
    moved = tmp_path / "run"
    shutil.copytree(coop_run, moved)
    config = moved / "config.yaml"
    config.write_text(config.read_text().replace(data_root, str(tmp_path / "gone")))
    images = os.path.join(data_root, "oxford_pets", "images")
    paths = sorted(os.path.join(images, name) for name in os.listdir(images))
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="vlprompt.build"):
        predictor = load_run(moved)
    assert capsys.readouterr().out == ""
    logged = [record.getMessage() for record in caplog.records if record.name == "vlprompt.build"]
    assert any(line.startswith("Loading CLIP (backbone") for line in logged)
    assert "Building transform_test" in logged and not any("Loading dataset" in line for line in logged)
    from_dataset = load_run(coop_run, root=data_root)  # the run's dataset read, as eval-only reads it
    assert predictor.classnames == from_dataset.classnames
    mine, theirs = predictor.predict(paths, topk=2), from_dataset.predict(paths, topk=2)
    assert [p.labels for p in mine] == [p.labels for p in theirs]
    for a, b in zip(mine, theirs):
        assert a.probabilities == pytest.approx(b.probabilities, abs=1e-6)


def test_one_default_top_k_in_python_and_on_the_command_line(coop_run, data_root, monkeypatch, capsys):
    import inspect

    from vlprompt.export import ExportedClassifier
    from vlprompt.prediction import DEFAULT_TOPK
    from vlprompt_app.predict import RunPredictor

    monkeypatch.chdir(ROOT)
    assert DEFAULT_TOPK == 1
    for predict in (RunPredictor.predict, ExportedClassifier.predict):
        assert inspect.signature(predict).parameters["topk"].default == DEFAULT_TOPK
    image = os.path.join(data_root, "oxford_pets", "images", sorted(os.listdir(
        os.path.join(data_root, "oxford_pets", "images")))[0])
    (prediction,) = load_run(coop_run).predict(image)
    assert len(prediction.labels) == 1
    assert predict_command.main([str(coop_run), image]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "path,label_1,probability_1,error" and rows[1].split(",")[1] == prediction.labels[0]


def test_a_missing_image_is_reported_before_the_model_is_built(coop_run, tmp_path, monkeypatch, capsys):
    from vlprompt_app import predict as predict_module

    def never(*args, **kwargs):
        raise AssertionError("the model was built before the images were checked")

    monkeypatch.setattr(predict_module, "load_run", never)
    assert predict_command.main([str(coop_run), str(tmp_path / "missing.png")]) == 2
    assert capsys.readouterr().err == f'Error: "{tmp_path / "missing.png"}" is neither an image file nor a folder of ' \
                                      "images.\n"


@pytest.mark.parametrize("argv, message", [
    (["{tmp}", "x.png"], "holds no config.yaml: it is not the folder of a training run"),
    (["{tmp}/missing", "x.png"], "is not a folder: expected the output folder of a training run"),
    (["{run}", "{images}", "--device", "tpu"], 'Unknown device "tpu": expected "cpu" or "cuda"'),
    (["{run}", "{images}", "--epoch", "7"], r'Model not found at ".*model.pth.tar-7"'),
    (["{run}", "{images}", "--output", "p.txt"], "must end in .csv or .json"),
])
def test_bad_input_is_one_paragraph_and_status_2(coop_run, data_root, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(ROOT)
    images = os.path.join(data_root, "oxford_pets", "images")
    argv = [a.format(tmp=tmp_path, run=coop_run, images=images) for a in argv]
    assert predict_command.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_method_that_cannot_score_other_names_is_refused_with_its_reason():
    from vlprompt.config import ConfigError
    from vlprompt_app.predict import check_unseen_classes

    refusing = [name for name in TRAINER_REGISTRY.registered_names()
                if TRAINER_REGISTRY.get(name).unseen_classes_refusal]
    assert "LP" in refusing
    with pytest.raises(ConfigError, match=r"^LP cannot score class names other than those it was trained on: .+"
                                          r"Leave out --classes"):
        check_unseen_classes("LP")
