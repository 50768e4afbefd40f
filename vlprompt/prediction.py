"""What a classifier says about one image: its top-k classes (``Prediction``); and where the
loaders of classifiers send what building a model prints.

The loaders (``vlprompt.load_classifier``, ``vlprompt_app.load_run``, ``export_run``,
``load_exported``) print nothing: what building reports (transforms, weights, the dataset) goes,
line by line, to the logger :data:`BUILD_LOGGER` at level INFO (:func:`logs_build`). It is silent
unless the program configures logging (``logging.basicConfig(level=logging.INFO)`` shows it); the
command lines show it on a stream of theirs (:func:`build_log_to`).
"""
import contextlib
import functools
import io
import logging
from dataclasses import dataclass, field
from typing import List

__all__ = ["BUILD_LOGGER", "DEFAULT_TOPK", "Prediction", "build_log_to", "logs_build", "top_classes"]

# Classes per image when none is asked for: the one best class, in the Python API
# (``predict(images)``) as on the command line (tools/predict.py without --topk).
DEFAULT_TOPK = 1
# The logger that receives, at level INFO, what building a classifier prints (module docstring).
BUILD_LOGGER = "vlprompt.build"


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


class _LinesToLog(io.TextIOBase):
    """A text stream that sends each complete line written to it to ``logger`` at INFO."""

    def __init__(self, logger):
        super().__init__()
        self.logger = logger
        self.pending = ""

    def writable(self):
        return True

    def write(self, text):
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            if line.strip():
                self.logger.info(line)
        return len(text)

    def flush(self):
        if self.pending.strip():
            self.logger.info(self.pending)
        self.pending = ""


def logs_build(function):
    """Decorator: what ``function`` prints on stdout goes to :data:`BUILD_LOGGER` (module docstring)."""

    @functools.wraps(function)
    def logged(*args, **kwargs):
        stream = _LinesToLog(logging.getLogger(BUILD_LOGGER))
        try:
            with contextlib.redirect_stdout(stream):
                return function(*args, **kwargs)
        finally:
            stream.flush()

    return logged


@contextlib.contextmanager
def build_log_to(stream):
    """Within the block, :data:`BUILD_LOGGER`'s lines are written to ``stream`` (a command line's stderr)."""
    logger = logging.getLogger(BUILD_LOGGER)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
