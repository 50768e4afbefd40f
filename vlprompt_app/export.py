"""Export a trained run to one classifier file, and load any such file.

``export_run(RUN_DIR, OUTPUT)`` builds the run's model as :func:`vlprompt_app.predict.load_run`
does (the eval-only path) and writes :mod:`vlprompt.export`'s format:

* a method that declares ``exports_class_text_features`` (plain CLIP image tower, classifier =
  class text features) gets a ``cosine`` head: the text features the model computes in its
  evaluation. Before writing, its logits on a probe batch are compared with the trainer's own;
  a declaration they contradict is an error. The file loads with ``vlprompt.load_classifier``
  (library only).
* every other method gets a ``trainer`` head: the run's merged config and the learned tensors of
  its checkpoints (the files ``load_model`` reads, without optimizer state). Loading it
  (:func:`load_exported`) rebuilds the trainer on the recorded class names, without a dataset,
  and loads those tensors through the trainer's own ``load_model``: the method's code is needed
  because its model is not CLIP plus a text classifier (image-tower prompts, adapters, test-time
  episodes).

A method whose predictions read more than its config and checkpoints declares why on its trainer
class (``export_refusal``, e.g. PromptAlign's source statistics) and is refused with that reason.
"""
import os.path as osp
import tempfile

from vlprompt.config import ConfigError, dump_cfg
from vlprompt.prediction import logs_build

__all__ = ["check_exportable", "export_run", "load_exported"]

CHECKPOINT_KEYS = ("state_dict", "epoch", "trainer_state")


@logs_build
def export_run(run_dir, output, epoch=None, device=None, root=None, test_time="", test_time_config="", opts=()):
    """Write the exported classifier of a run to ``output``; returns the record written.

    Args: as :func:`vlprompt_app.predict.load_run` (the run's own classes); ``opts`` (KEY VALUE
        overrides) are part of the exported config.

    Raises:
        ConfigError: as load_run, a method that declares why it cannot be exported (``export_refusal``
            on its trainer class), or a backbone weights file that does not exist (nothing to hash).
    """
    from vlprompt.clip.templates import dataset_template
    from vlprompt.engine.amp import resolve_precision
    from vlprompt.engine.run_folder import RunFolder
    from vlprompt.export import file_sha256, preprocess_settings, save_export
    from vlprompt.utils import load_checkpoint
    from vlprompt_app.predict import build_run_predictor, run_config

    cfg, last_epoch = run_config(run_dir, test_time, test_time_config, opts)
    check_exportable(cfg.TRAINER.NAME)
    epoch = last_epoch if epoch is None else epoch
    predictor = build_run_predictor(run_dir, cfg, epoch, device=device, root=root, opts=opts)
    trainer = predictor.trainer
    weights = cfg.MODEL.BACKBONE.WEIGHTS
    if not osp.isfile(weights):
        raise ConfigError(f'The run\'s backbone weights "{weights}" (MODEL.BACKBONE.WEIGHTS) are not a file here, '
                          "so the export cannot record their sha256; run from the folder the path is relative to.")
    record = {
        "trainer": cfg.TRAINER.NAME,
        "backbone": {"name": cfg.MODEL.BACKBONE.NAME, "weights": weights, "sha256": file_sha256(weights)},
        "classnames": list(trainer.dm.dataset.classnames),
        "template": dataset_template(trainer.dm.dataset),
        "preprocess": preprocess_settings(cfg, type(trainer.dm.dataset).image_border),
        "precision": resolve_precision(cfg),
        "eval_scope": cfg.TEST.ROLE,
    }
    if getattr(type(trainer), "exports_class_text_features", False):
        record["head"] = _cosine_head(trainer)
    else:
        checkpoints = {}
        for name in trainer.get_model_names():
            checkpoint = load_checkpoint(str(RunFolder(run_dir).checkpoint_path(name, epoch)))
            checkpoints[name] = {key: checkpoint.get(key) for key in CHECKPOINT_KEYS}
        record["head"] = {"kind": "trainer", "config": dump_cfg(cfg), "epoch": epoch, "checkpoints": checkpoints}
    save_export(output, record)
    return record


def check_exportable(trainer_name):
    """ConfigError when the trainer declares why its model cannot be exported (``export_refusal``)."""
    from vlprompt.engine import TRAINER_REGISTRY

    reason = getattr(TRAINER_REGISTRY.get(trainer_name), "export_refusal", "")
    if reason:
        raise ConfigError(f"{trainer_name} cannot be exported: {reason}.")


def _cosine_head(trainer):
    """{"kind": "cosine", "text_features": [K, E]} of a trainer's loaded model, checked on a probe batch."""
    import torch
    import torch.nn.functional as F

    model = trainer.model
    trainer.set_model_mode("eval")
    size = trainer.cfg.INPUT.SIZE
    probe = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0)).to(trainer.device)
    with torch.no_grad(), model.evaluation():
        expected = trainer.model_inference(probe)
        text = model.class_text_features()
        with trainer.autocast():
            image = F.normalize(model.clip.encode_image(probe), dim=-1)
            logits = model.clip.logit_scale.exp() * image @ text.t()
    if not torch.allclose(logits.float(), expected.float(), rtol=1e-4, atol=1e-4):
        raise RuntimeError(f"{type(trainer).__name__} declares exports_class_text_features, but its logits are not "
                           "logit_scale * normalize(CLIP image features) @ class text features (probe batch).")
    return {"kind": "cosine", "text_features": text.detach().cpu()}


@logs_build
def load_exported(path, weights=None, device=None, batch_size=None):
    """A predictor of an exported file: ``vlprompt.export.ExportedClassifier`` for a cosine head (the
    library alone), else a :class:`~vlprompt_app.predict.RunPredictor` of the method's trainer.
    Both have ``predict(images, topk, progress)`` and ``classnames``.

    Raises:
        ConfigError: not an export, or a weights file whose sha256 is not the recorded one.
    """
    import torch

    from vlprompt.engine.run_folder import RunFolder
    from vlprompt.export import check_weights, load_classifier, read_export
    from vlprompt_app.predict import build_predictor
    from vlprompt_app.project import import_project

    record = read_export(path)
    if record["head"]["kind"] == "cosine":
        return load_classifier(path, weights, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                               batch_size or 64)
    weights = check_weights(record, weights)
    import_project()
    head = record["head"]
    with tempfile.TemporaryDirectory(prefix="vlprompt_export_") as folder:
        run = RunFolder(folder)  # the exported run, rebuilt for the trainer's load_model
        run.write_config(head["config"])
        cfg = run.read_config()
        cfg.MODEL.BACKBONE.WEIGHTS = weights
        for name, checkpoint in head["checkpoints"].items():
            target = run.checkpoint_path(name, head["epoch"])
            target.parent.mkdir(parents=True, exist_ok=True)
            torch.save(checkpoint, target)
        return build_predictor(cfg, model_dir=folder, epoch=head["epoch"], classes=record["classnames"],
                               device=device, batch_size=batch_size, scope=record["eval_scope"],
                               template=record.get("template"))
