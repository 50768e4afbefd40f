"""What a classifier says about one image: its top-k classes (``Prediction``)."""
from dataclasses import dataclass, field
from typing import List

__all__ = ["DEFAULT_TOPK", "Prediction", "top_classes"]

# Classes per image when none is asked for: the one best class, in the Python API
# (``predict(images)``) as on the command line (tools/predict.py without --topk).
DEFAULT_TOPK = 1


@dataclass
class Prediction:
    """The top-k classes of one image.

    Attributes:
        source: the image's path, or ``<image N>`` for an in-memory image (N: its position).
        labels: class names, most probable first (empty when ``error`` is set).
        probabilities: their softmax probabilities over all scored classes.
        error: why the image could not be read ("" when it was scored).
    """

    source: str
    labels: List[str] = field(default_factory=list)
    probabilities: List[float] = field(default_factory=list)
    error: str = ""


def top_classes(source, logits, classnames, topk):
    """The Prediction of logits [K] over ``classnames`` (K names): the min(topk, K) most probable."""
    probabilities = logits.float().softmax(dim=-1)
    values, labels = probabilities.topk(max(1, min(int(topk), len(classnames))))
    return Prediction(source, [classnames[i] for i in labels.tolist()], values.tolist())
