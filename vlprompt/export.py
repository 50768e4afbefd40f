"""The exported classifier: one file per run with what classification needs, and its loader.

The file (``torch.save`` of plain data, read back with ``weights_only=True``) holds::

    format, version          "vlprompt-classifier", 1
    trainer                  the method's trainer name
    backbone                 {"name": MODEL.BACKBONE.NAME, "weights": the weights file's path as
                              recorded, "sha256": its hash}
    classnames               the K class names, by label
    template                 the class sentence of the run's dataset (a trainer head builds its
                             class prompts from it; files without it use DATASET.NAME's)
    preprocess               the INPUT settings of the test transform (resolved: the backbone's values
                              where the config left them empty) and the dataset's image border
    precision                the autocast precision the run evaluated with ("fp32", "fp16", "bf16")
    head                     how logits [B, K] are computed (below)

Two kinds of head:

* ``{"kind": "cosine", "text_features": [K, E], "logit_scale": float}``: for methods whose image
  tower is plain CLIP and whose classifier is the class text features (CoOp, KgCoOp, ProGrad,
  zero-shot CLIP: ``exports_class_text_features`` on the trainer class): logits =
  logit_scale * normalize(CLIP image features) @ text_features.T. :func:`load_classifier` loads
  it with this library alone: no dataset, no training config, no ``trainers`` import.
* ``{"kind": "trainer", "config": the run's merged config (YAML text), "checkpoints": {module:
  {"state_dict", "epoch", "trainer_state"}}}``: every other method (prompts in the image tower as
  MaPLe, DeAR or RAda; feature adapters as CLIP-Adapter; test-time episodes). Its model is the
  method's own code, so loading needs the trainer: ``vlprompt_app.export.load_exported`` (an
  application-layer function, because the library never imports ``trainers``).

Either way the backbone's weights file is checked against the recorded sha256 before it is used;
another file is refused with both hashes and the path.
"""
import os
import os.path as osp

import torch

from vlprompt.config import ConfigError
from vlprompt.fileio import atomic_write, file_sha256
from vlprompt.prediction import DEFAULT_TOPK, Prediction, logs_build, top_classes

__all__ = [
    "EXPORT_FORMAT", "EXPORT_VERSION", "ExportedClassifier", "check_weights", "file_sha256", "load_classifier",
    "read_export", "save_export", "preprocess_settings", "test_transform",
]

EXPORT_FORMAT = "vlprompt-classifier"
EXPORT_VERSION = 1
PREPROCESS_KEYS = ("SIZE", "INTERPOLATION", "TRANSFORMS", "PIXEL_MEAN", "PIXEL_STD", "NO_TRANSFORM", "RESIZE_MODE")
# Values of keys an older export does not record: the only test transform there was then.
_PREPROCESS_BEFORE = {"RESIZE_MODE": "shortest"}


def save_export(path, record):
    """Write an export record (see the module docstring) atomically."""
    with atomic_write(str(path), "wb") as f:
        torch.save(dict(record, format=EXPORT_FORMAT, version=EXPORT_VERSION), f)
    return path


def read_export(path):
    """The record of an exported classifier file.

    Raises:
        ConfigError: the file is missing, unreadable, or not an export of this format and version.
    """
    if not osp.isfile(path):
        raise ConfigError(f'No exported classifier at "{path}" (tools/export.py RUN_DIR --output FILE writes one).')
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  (any unpickling failure means: not such a file)
        detail = " ".join(str(error).split(". ")[0].split())
        raise ConfigError(
            f'"{path}" cannot be read as an exported classifier: the file is damaged (for example cut short by '
            f"an interrupted copy or download; it has {osp.getsize(path)} bytes) or was not written by "
            f"tools/export.py. Copy or export it again ({type(error).__name__}: {detail})."
        ) from None
    if not isinstance(record, dict) or record.get("format") != EXPORT_FORMAT:
        raise ConfigError(f'"{path}" is not an exported classifier (no format "{EXPORT_FORMAT}").')
    if record.get("version") != EXPORT_VERSION:
        raise ConfigError(f'"{path}" is an exported classifier of version {record.get("version")}; this '
                          f"library reads version {EXPORT_VERSION}: export the run again.")
    return record


def check_weights(record, weights=None):
    """The weights file to load (``weights`` or the recorded path), after checking its sha256.

    Raises:
        ConfigError: the file is missing, or its hash is not the recorded one (both are named).
    """
    backbone = record["backbone"]
    path = weights or backbone["weights"]
    if not backbone["sha256"]:
        return path
    if not osp.isfile(path):
        raise ConfigError(f'The backbone weights file "{path}" does not exist; pass weights= (--weights) with '
                          f'the file of sha256 {backbone["sha256"]} ({backbone["name"]}).')
    found = file_sha256(path)
    if found != backbone["sha256"]:
        raise ConfigError(f'The backbone weights file "{path}" has sha256 {found}, but the classifier was '
                          f'exported with sha256 {backbone["sha256"]} ({backbone["weights"]}): it needs those '
                          "exact weights.")
    return path


def preprocess_settings(cfg, image_border=0):
    """The INPUT settings of the test transform (plain data) and the dataset's image border."""
    from vlprompt.clip.preprocess import resolved_input

    given = resolved_input(cfg).INPUT
    settings = {"SIZE": given.SIZE, "INTERPOLATION": given.INTERPOLATION, "TRANSFORMS": given.TRANSFORMS,
                "PIXEL_MEAN": given.PIXEL_MEAN, "PIXEL_STD": given.PIXEL_STD, "NO_TRANSFORM": given.NO_TRANSFORM,
                "RESIZE_MODE": given.RESIZE_MODE}
    settings = {key: list(value) if isinstance(value, tuple) else value for key, value in settings.items()}
    return dict(settings, image_border=int(image_border))


def test_transform(preprocess):
    """The test transform (PIL image -> tensor [3, H, W]) of :func:`preprocess_settings`'s output."""
    import torchvision.transforms as T

    from vlprompt.config import get_cfg_default
    from vlprompt.data.data_manager import CropBorder
    from vlprompt.data.transforms import build_transform

    cfg = get_cfg_default()
    for key in PREPROCESS_KEYS:
        value = preprocess.get(key, _PREPROCESS_BEFORE.get(key))
        cfg.INPUT[key] = tuple(value) if isinstance(value, list) else value
    tfm = build_transform(cfg, is_train=False)
    return T.Compose([CropBorder(preprocess["image_border"]), tfm]) if preprocess["image_border"] else tfm


class ExportedClassifier:
    """A cosine-head export loaded with the library alone.

    Attributes:
        classnames: the K class names. clip: the CLIPRunner. device: where it runs.
    """

    def __init__(self, record, weights, device="cpu", batch_size=64):
        from vlprompt.clip import CLIPRunner, load_clip
        from vlprompt.engine.amp import MixedPrecision

        self.record = record
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.classnames = list(record["classnames"])
        model, _ = load_clip(record["backbone"]["name"], weights, device=self.device)
        self.clip = CLIPRunner(model)
        self.amp = MixedPrecision(record["precision"], self.device)
        head = record["head"]
        self.text_features = head["text_features"].to(self.device)
        self.transform = test_transform(record["preprocess"])

    def logits_of_batch(self, images):
        """Logits [B, K] of transformed images [B, 3, H, W], as the method's model computes them."""
        with torch.no_grad(), self.amp.autocast():
            features = torch.nn.functional.normalize(self.clip.encode_image(images.to(self.device)), dim=-1)
            return self.clip.logit_scale.exp() * features @ self.text_features.t()

    def predict(self, images, topk=DEFAULT_TOPK, progress=False):
        """One Prediction per image (paths, PIL images or transformed tensors [3, H, W]) with its ``topk``
        best classes (default DEFAULT_TOPK, as tools/predict.py); an unreadable path gives a Prediction
        with ``error`` set. ``progress``: a tqdm bar over the images."""
        from tqdm import tqdm

        from vlprompt.utils import read_image

        items = list(images) if isinstance(images, (list, tuple)) else [images]
        predictions, batch, positions = [None] * len(items), [], []

        def flush():
            if batch:
                logits = self.logits_of_batch(torch.stack(batch)).float().cpu()
                for position, row in zip(positions, logits):
                    predictions[position] = top_classes(_source(items[position], position), row, self.classnames, topk)
                batch.clear()
                positions.clear()

        for position, item in enumerate(tqdm(items, disable=not progress, desc="Predicting")):
            if isinstance(item, (str, os.PathLike)):
                try:
                    item = read_image(str(item))
                except OSError as error:
                    predictions[position] = Prediction(str(items[position]), error=str(error))
                    continue
            batch.append(item if isinstance(item, torch.Tensor) else self.transform(item.convert("RGB")))
            positions.append(position)
            if len(batch) == self.batch_size:
                flush()
        flush()
        return predictions


def _source(item, position):
    return str(item) if isinstance(item, (str, os.PathLike)) else f"<image {position}>"


@logs_build
def load_classifier(path, weights=None, device="cpu", batch_size=64):
    """The ExportedClassifier of a cosine-head export file.

    Args:
        path: the exported file. weights: the backbone weights file (default: the recorded path);
            its sha256 must be the recorded one. device: "cpu" or "cuda".

    Raises:
        ConfigError: not an export, another weights file, or a head that needs its method's code
            (load it with ``vlprompt_app.export.load_exported``).
    """
    record = read_export(path)
    if record["head"]["kind"] != "cosine":
        raise ConfigError(f'"{path}" holds a {record["trainer"]} model, whose classifier is the method\'s own code '
                          "(not class text features over plain CLIP): load it with "
                          "vlprompt_app.export.load_exported, which imports the trainer.")
    return ExportedClassifier(record, check_weights(record, weights), device, batch_size)
