"""Evaluators (Dassl ``EvaluatorBase`` / ``Classification``)."""
import os.path as osp
from collections import OrderedDict, defaultdict

import numpy as np
import torch

from vlprompt.run_layout import CMAT_FILENAME
from vlprompt.utils import atomic_write

from .build import EVALUATOR_REGISTRY

__all__ = ["EvaluatorBase", "Classification", "macro_f1_score", "normalized_confusion_matrix"]


def macro_f1_score(y_true, y_pred):
    """Macro F1 over the labels present in ``y_true`` (scikit-learn's
    ``f1_score(average="macro", labels=unique(y_true))``).

    Per label: F1 = 2 TP / (2 TP + FP + FN), which is 0 for a label never predicted
    correctly. Returns a float in [0, 1].
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    scores = []
    for label in np.unique(y_true):
        true_positive = np.sum((y_true == label) & (y_pred == label))
        false_positive = np.sum((y_true != label) & (y_pred == label))
        false_negative = np.sum((y_true == label) & (y_pred != label))
        scores.append(2 * true_positive / (2 * true_positive + false_positive + false_negative))
    return float(np.mean(scores))


def normalized_confusion_matrix(y_true, y_pred):
    """Row-normalised confusion matrix (scikit-learn's ``confusion_matrix(normalize="true")``).

    Rows and columns are the sorted labels occurring in ``y_true`` or ``y_pred``;
    entry [i, j] = fraction of samples of label i predicted as label j (a row without
    samples is all zeros). Returns a float64 array [L, L].
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    labels = np.unique(np.concatenate([y_true, y_pred]))
    rows, cols = np.searchsorted(labels, y_true), np.searchsorted(labels, y_pred)
    counts = np.zeros((len(labels), len(labels)), dtype=np.float64)
    np.add.at(counts, (rows, cols), 1)
    row_sums = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, row_sums, out=np.zeros_like(counts), where=row_sums > 0)


class EvaluatorBase:
    """Interface: ``reset()``, ``process(model_output, ground_truth)``, ``evaluate()``."""

    def __init__(self, cfg):
        self.cfg = cfg

    def reset(self):
        raise NotImplementedError

    def process(self, mo, gt):
        raise NotImplementedError

    def evaluate(self):
        raise NotImplementedError


@EVALUATOR_REGISTRY.register()
class Classification(EvaluatorBase):
    """Accuracy, error rate and macro F1 of a classifier; optionally per-class accuracy
    (``TEST.PER_CLASS_RESULT``, needs ``lab2cname``) and the confusion matrix
    (``TEST.COMPUTE_CMAT``, saved to ``OUTPUT_DIR/cmat.pt``)."""

    def __init__(self, cfg, lab2cname=None, **kwargs):
        super().__init__(cfg)
        if cfg.TEST.PER_CLASS_RESULT and lab2cname is None:
            raise ValueError("TEST.PER_CLASS_RESULT is True, so Classification needs lab2cname (label -> class name)")
        self._lab2cname = lab2cname
        self.reset()

    def reset(self):
        self._correct = 0
        self._total = 0
        self._y_true = []
        self._y_pred = []
        self._per_class_res = defaultdict(list) if self.cfg.TEST.PER_CLASS_RESULT else None

    def process(self, mo, gt):
        """Record a batch: ``mo`` logits [N, C], ``gt`` labels [N]; prediction = arg-max."""
        pred = mo.detach().max(1)[1]
        gt = gt.detach().to(pred.device)
        matches = pred.eq(gt)
        self._correct += int(matches.sum().item())
        self._total += gt.shape[0]
        labels = gt.tolist()
        self._y_true.extend(labels)
        self._y_pred.extend(pred.tolist())
        if self._per_class_res is not None:
            for label, is_correct in zip(labels, matches.tolist()):
                self._per_class_res[label].append(int(is_correct))

    def evaluate(self):
        """Print the result block and return an OrderedDict of full-precision floats:
        accuracy, error_rate, macro_f1 (percent), and perclass_accuracy if enabled."""
        if self._total == 0:
            raise ValueError("Classification.evaluate() was called before any sample was processed")
        accuracy = 100.0 * self._correct / self._total
        error_rate = 100.0 - accuracy
        macro_f1 = 100.0 * macro_f1_score(self._y_true, self._y_pred)
        results = OrderedDict(accuracy=accuracy, error_rate=error_rate, macro_f1=macro_f1)
        print(
            "=> result\n"
            f"* total: {self._total:,}\n"
            f"* correct: {self._correct:,}\n"
            f"* accuracy: {accuracy:.1f}%\n"
            f"* error: {error_rate:.1f}%\n"
            f"* macro_f1: {macro_f1:.1f}%"
        )
        if self._per_class_res is not None:
            results["perclass_accuracy"] = self._print_per_class()
        if self.cfg.TEST.COMPUTE_CMAT:
            self._save_confusion_matrix()
        return results

    def _print_per_class(self):
        """Print one line per label (ascending) and the mean per-class accuracy; return the mean."""
        print("=> per-class result")
        accuracies = []
        for label in sorted(self._per_class_res):
            outcomes = self._per_class_res[label]
            correct, total = sum(outcomes), len(outcomes)
            accuracy = 100.0 * correct / total
            accuracies.append(accuracy)
            print(
                f"* class: {label} ({self._lab2cname[label]})\t"
                f"total: {total:,}\tcorrect: {correct:,}\tacc: {accuracy:.1f}%"
            )
        mean_accuracy = float(np.mean(accuracies))
        print(f"* average: {mean_accuracy:.1f}%")
        return mean_accuracy

    def _save_confusion_matrix(self):
        cmat = normalized_confusion_matrix(self._y_true, self._y_pred)
        save_path = osp.join(self.cfg.OUTPUT_DIR, CMAT_FILENAME)
        with atomic_write(save_path, "wb") as f:
            torch.save(cmat, f)
        print(f"Confusion matrix is saved to {save_path}")
