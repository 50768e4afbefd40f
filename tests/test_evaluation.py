"""compute_accuracy and the Classification evaluator (Dassl's metrics)."""
import numpy as np
import pytest
import torch

from vlprompt.config import get_cfg_default
from vlprompt.evaluation import EVALUATOR_REGISTRY, Classification, EvaluatorBase, build_evaluator
from vlprompt.metrics import compute_accuracy

# 11 samples over labels 0..3; label 3 is never predicted, label 4 is predicted but never true.
Y_TRUE = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3]
Y_PRED = [0, 0, 1, 1, 0, 2, 2, 1, 0, 1, 4]
# Hand-computed F1 = 2TP / (2TP + FP + FN): label 0: 4/7, 1: 2/6, 2: 4/6, 3: 0 -> mean 11/28.
MACRO_F1 = 100 * 11 / 28
LAB2CNAME = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "frog"}


def _cfg(tmp_path=None, **test_keys):
    cfg = get_cfg_default()
    if tmp_path is not None:
        cfg.OUTPUT_DIR = str(tmp_path / "out")
    for key, value in test_keys.items():
        cfg.TEST[key] = value
    return cfg


def _one_hot_logits(predictions, num_classes=5):
    return torch.nn.functional.one_hot(torch.tensor(predictions), num_classes).float()


def _feed(evaluator, y_true, y_pred, batch_size=4):
    logits, labels = _one_hot_logits(y_pred), torch.tensor(y_true)
    for start in range(0, len(y_true), batch_size):
        evaluator.process(logits[start:start + batch_size], labels[start:start + batch_size])


def test_compute_accuracy_topk():
    output = torch.tensor([[0.1, 0.5, 0.4], [0.8, 0.15, 0.05], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    target = torch.tensor([2, 0, 1, 2])
    top1, top2 = compute_accuracy(output, target, topk=(1, 2))
    assert top1.shape == (1,) and top1.item() == 25.0
    assert top2.item() == 75.0
    assert compute_accuracy((output, "aux"), target)[0].item() == 25.0


def test_result_block_and_full_precision_values(capsys):
    evaluator = Classification(_cfg())
    _feed(evaluator, Y_TRUE, Y_PRED)
    results = evaluator.evaluate()
    assert list(results) == ["accuracy", "error_rate", "macro_f1"]
    assert results["accuracy"] == 100 * 5 / 11
    assert results["error_rate"] == 100 - 100 * 5 / 11
    assert results["macro_f1"] == pytest.approx(MACRO_F1, abs=1e-12)
    assert all(type(value) is float for value in results.values())
    assert capsys.readouterr().out == (
        "=> result\n* total: 11\n* correct: 5\n* accuracy: 45.5%\n* error: 54.5%\n* macro_f1: 39.3%\n"
    )


def test_thousands_separators(capsys):
    evaluator = Classification(_cfg())
    _feed(evaluator, [0] * 1000 + [1] * 234, [0] * 1234, batch_size=500)
    results = evaluator.evaluate()
    assert results["macro_f1"] == pytest.approx(100 * (2000 / 2234) / 2)
    assert capsys.readouterr().out == (
        "=> result\n* total: 1,234\n* correct: 1,000\n* accuracy: 81.0%\n* error: 19.0%\n* macro_f1: 44.8%\n"
    )


def test_per_class_result(capsys):
    evaluator = Classification(_cfg(PER_CLASS_RESULT=True), lab2cname=LAB2CNAME)
    _feed(evaluator, Y_TRUE, Y_PRED)
    results = evaluator.evaluate()
    lines = capsys.readouterr().out.splitlines()
    assert lines[6:] == [
        "=> per-class result",
        "* class: 0 (cat)\ttotal: 3\tcorrect: 2\tacc: 66.7%",
        "* class: 1 (dog)\ttotal: 2\tcorrect: 1\tacc: 50.0%",
        "* class: 2 (bird)\ttotal: 4\tcorrect: 2\tacc: 50.0%",
        "* class: 3 (fish)\ttotal: 2\tcorrect: 0\tacc: 0.0%",
        "* average: 41.7%",
    ]
    assert results["perclass_accuracy"] == pytest.approx((200 / 3 + 50 + 50 + 0) / 4)


def test_per_class_result_needs_lab2cname():
    with pytest.raises(ValueError, match="needs lab2cname"):
        Classification(_cfg(PER_CLASS_RESULT=True))


def test_confusion_matrix_saved_row_normalised(tmp_path, capsys):
    cfg = _cfg(tmp_path, COMPUTE_CMAT=True)
    evaluator = Classification(cfg)
    _feed(evaluator, Y_TRUE, Y_PRED)
    evaluator.evaluate()
    path = tmp_path / "out" / "cmat.pt"
    assert capsys.readouterr().out.splitlines()[-1] == f"Confusion matrix is saved to {path}"
    cmat = torch.load(path, weights_only=False)
    expected = np.array(
        [
            [2 / 3, 1 / 3, 0, 0, 0],
            [0.5, 0.5, 0, 0, 0],
            [0.25, 0.25, 0.5, 0, 0],
            [0, 0.5, 0, 0, 0.5],
            [0, 0, 0, 0, 0],  # label 4 never occurs in the ground truth
        ]
    )
    np.testing.assert_allclose(cmat, expected, atol=1e-12)


def test_reset_clears_counts():
    evaluator = Classification(_cfg())
    _feed(evaluator, Y_TRUE, Y_PRED)
    evaluator.reset()
    with pytest.raises(ValueError, match="before any sample was processed"):
        evaluator.evaluate()
    _feed(evaluator, [1, 1], [1, 0])
    assert evaluator.evaluate()["accuracy"] == 50.0


def test_build_evaluator_prints_and_checks_the_name(capsys):
    evaluator = build_evaluator(_cfg(), lab2cname=LAB2CNAME)
    assert isinstance(evaluator, Classification) and isinstance(evaluator, EvaluatorBase)
    assert capsys.readouterr().out == "Loading evaluator: Classification\n"
    cfg = _cfg(EVALUATOR="Clasification")
    with pytest.raises(ValueError, match=r"but got \[Clasification\] \(do you mean \[Classification\]\?\)"):
        build_evaluator(cfg)
    quiet = _cfg()
    quiet.VERBOSE = False
    build_evaluator(quiet)
    assert capsys.readouterr().out == ""
    assert "Classification" in EVALUATOR_REGISTRY.registered_names()


def test_star_imports_expose_evaluation_and_metrics_names():
    namespace = {}
    exec("from vlprompt.evaluation import *\nfrom vlprompt.metrics import *", namespace)
    assert {"build_evaluator", "EVALUATOR_REGISTRY", "EvaluatorBase", "Classification", "compute_accuracy"} <= set(namespace)
