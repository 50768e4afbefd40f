"""Test sets scored through another dataset's classifier (ObjectNet through ImageNet's 1,000 classes).

Some test sets are defined by groups of another dataset's classes: each of ObjectNet's 113
classes is one or more ImageNet classes. A model trained on ImageNet predicts over ImageNet's
classes, and a prediction counts as correct when it is one of the classes grouped under the
image's label (WiSE-FT's and FLYP's ObjectNet evaluation). Such a dataset sets its
``prediction_map`` (DatasetBase attribute, None otherwise); the engine then builds the model's
classifier from ``prediction_map.classnames`` instead of the dataset's class names, and turns
the model's logits into label scores with ``prediction_map.project`` before the evaluator.
"""
import torch

__all__ = ["PredictionMap"]


class PredictionMap:
    """The classes a model predicts over, and the dataset label each of them counts as.

    Args:
        classnames (list[str]): the P classes the model scores (e.g. ImageNet's 1,000, in
            ImageNet label order).
        labels (list[int]): for each of the P classes, the dataset label it counts as, or -1
            for a class outside the dataset (never a correct prediction, never predicted).
        num_labels (int): L, the number of dataset labels; each of 0..L-1 must have a class.

    Raises:
        ValueError: the lists differ in length, a label is out of range or has no class.
    """

    def __init__(self, classnames, labels, num_labels):
        if len(classnames) != len(labels):
            raise ValueError(f"PredictionMap: {len(classnames)} class names but {len(labels)} labels")
        bad = sorted({label for label in labels if not -1 <= label < num_labels})
        if bad:
            raise ValueError(f"PredictionMap: labels must be -1 or in 0..{num_labels - 1}, got {bad[:5]}")
        empty = sorted(set(range(num_labels)) - set(labels))
        if empty:
            raise ValueError(f"PredictionMap: label(s) {empty[:5]} have no class to predict")
        self.classnames = list(classnames)
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.num_labels = num_labels

    def classes_of(self, label):
        """Indices (into ``classnames``) of the classes that count as ``label``."""
        return (self.labels == label).nonzero().flatten().tolist()

    def project(self, logits):
        """Label scores [B, L] from class logits [B, P]: per label, the max over its classes.

        The arg-max of the result is the label of the best-scoring class among those that
        count as some label (classes mapped to -1 are ignored).

        Raises:
            ValueError: logits do not have P columns.
        """
        if logits.dim() != 2 or logits.shape[1] != len(self.classnames):
            raise ValueError(
                f"PredictionMap.project expects logits [B, {len(self.classnames)}] (one column per class of the "
                f"prediction map), got {list(logits.shape)}"
            )
        mapped = self.labels >= 0
        index = self.labels[mapped].to(logits.device).expand(logits.shape[0], -1)
        scores = torch.full((logits.shape[0], self.num_labels), float("-inf"), dtype=logits.dtype, device=logits.device)
        return scores.scatter_reduce(1, index, logits[:, mapped.to(logits.device)], reduce="amax")
