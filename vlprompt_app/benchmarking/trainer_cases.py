"""The per-trainer cases of ``tools/benchmark.py trainers``, collected from the trainers, and how a
case's trainer is built.

Every trainer of the ``trainers`` package declares its cases in its class body
(``benchmark_cases``, a tuple of :class:`vlprompt.engine.benchmark_case.Case`: its ViT-B/16 config,
its kind and the project's targets); ``declared_cases`` collects them from the registry, and
``check_coverage`` fails with the names of the trainers that declare none, so a new trainer makes
the benchmark (and tests/test_benchmark.py) fail until its file declares its case.
``build_trainer`` builds a case's trainer through its own class from its config, with synthetic
class names instead of a dataset.
"""
import contextlib
import dataclasses
import io
import os.path as osp
from types import SimpleNamespace

import torch

from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import CACHED
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project

ROOT = str(repository_root())
# The project's committed tiny CLIP, which the cases' synthetic configs are written for (32 px).
SYNTHETIC_CLIP = osp.join(ROOT, "configs", "clip", "tiny-synthetic-clip.json")
SYNTHETIC_WEIGHTS = osp.join(ROOT, "weights", "tiny-synthetic-clip.pt")
SYNTHETIC_IMAGE_SIZE = 32


class BenchmarkCoverageError(RuntimeError):
    """A trainer of the ``trainers`` package declares no benchmark case."""


def project_trainers():
    """Registered trainers defined in the ``trainers`` package (not ones a test or a user
    script registered for itself), in registration order."""
    return [name for name in TRAINER_REGISTRY.registered_names()
            if TRAINER_REGISTRY.get(name).__module__.split(".")[0] == "trainers"]


def cases_of(name):
    """The cases that trainer ``name`` declares in its own class body, with ``trainer`` and ``name``
    filled in ([] when it declares none: a subclass does not inherit its parent's rows)."""
    declared = vars(TRAINER_REGISTRY.get(name)).get("benchmark_cases", ())
    return [dataclasses.replace(case, trainer=name, name=case.name or name) for case in declared]


def check_coverage(registered):
    """Raise BenchmarkCoverageError unless every trainer named in ``registered`` declares a case."""
    missing = [name for name in registered if not cases_of(name)]
    if missing:
        raise BenchmarkCoverageError(
            "tools/benchmark.py trainers covers every registered trainer, but found registered trainer(s) "
            f"without a benchmark case: {', '.join(missing)}. Declare benchmark_cases in the trainer's class "
            "body (vlprompt.engine.benchmark_case.Case): the trainer's ViT-B/16 config, its kind (train, "
            "cached, eval-only or test-time) and the project's targets if any."
        )


def declared_cases():
    """Every case the project's trainers declare, in registration order (the trainers are imported)."""
    import_project()
    return [case for name in project_trainers() for case in cases_of(name)]


def select_cases(names, cases=None):
    """The cases whose trainer or case name is in ``names`` (all cases when ``names`` is empty), among
    ``cases`` (default: ``declared_cases()``)."""
    cases = declared_cases() if cases is None else cases
    if not names:
        return list(cases)
    known = {case.trainer for case in cases} | {case.name for case in cases}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"error: unknown trainer(s) {unknown}; choose among {sorted(known)}")
    return [case for case in cases if case.trainer in names or case.name in names]


def synthetic_case(case):
    """``case`` built from its synthetic config (``Case.synthetic_config`` with ``synthetic_opts``)
    for the tiny CLIP instead of ViT-B/16, without the targets and official ratios, which are
    ViT-B/16's."""
    return dataclasses.replace(case, config=case.synthetic_config, opts=tuple(case.opts) + tuple(case.synthetic_opts),
                               train_target=None, eval_target=None, official_train=None, official_eval=None)


def case_named(name):
    """The declared case whose (row) name is ``name``."""
    for case in declared_cases():
        if case.name == name:
            return case
    raise KeyError(f"no trainer declares a benchmark case named {name!r}")


# --------------------------------------------------------------------------- building

class _NoBatches:
    """Stands in for a training loader: has a length (schedules read it), yields nothing."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __iter__(self):
        raise RuntimeError("the benchmark builds trainers without data; it feeds batches itself")


class SyntheticClasses:
    """Trainer mixin: ``benchmark_classes`` class names ("class number i") instead of a dataset."""

    benchmark_classes = 50

    def build_data_loader(self):
        names = [f"class number {index}" for index in range(self.benchmark_classes)]
        dataset = SimpleNamespace(classnames=names, train_x=[], val=[], test=[], prediction_map=None)
        self.dm = SimpleNamespace(dataset=dataset, train_loader_x=_NoBatches(1000), val_loader=None,
                                  test_loader=None, num_classes=len(names))
        self.train_loader_x, self.train_loader_u = self.dm.train_loader_x, None
        self.val_loader = self.test_loader = None
        self.num_classes, self.num_source_domains = len(names), 1
        self.lab2cname = dict(enumerate(names))


def build_cfg(case, settings, output_dir):
    """The case's config: its trainer YAML, the benchmark's backbone, input, batch and precision
    (plus the overrides of ``case.prepare``)."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, osp.join(ROOT, "configs", "trainers", case.config))
    cfg.TRAINER.NAME = case.trainer
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = settings["backbone"], settings["weights"]
    cfg.INPUT.SIZE = (settings["image_size"], settings["image_size"])
    cfg.USE_CUDA = settings["device"] == "cuda"
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = case_batch(case, settings)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.FEATURE_CACHE.ENABLED = case.kind == CACHED
    cfg.FEATURE_CACHE.DIR = osp.join(output_dir, "feature_cache")
    cfg.OUTPUT_DIR = output_dir
    node = cfg.TRAINER.get(case.trainer.upper())
    # trainers without a node (zero-shot CLIP) follow the engine's default; prec None keeps the config file's
    if node is not None and "PREC" in node and settings["prec"] is not None:
        node.PREC = settings["prec"]
    prepared = case.prepare(settings, output_dir) if case.prepare is not None else ()
    merge_from_list(cfg, list(case.opts) + list(prepared) + list(settings["opts"]))
    cfg.freeze()
    return cfg


def build_trainer(case, settings, output_dir):
    """The case's trainer class, built from its config with synthetic class names."""
    trainer_class = TRAINER_REGISTRY.get(case.trainer)
    benchmark_class = type(f"Benchmark{case.trainer}", (SyntheticClasses, trainer_class),
                           {"benchmark_classes": settings["classes"]})
    cfg = build_cfg(case, settings, output_dir)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = benchmark_class(cfg)
        if case.after_build is not None:
            case.after_build(trainer)
        return trainer


def case_batch(case, settings):
    return case.batch or settings["batch"]


def training_batch(case, trainer, images, labels):
    """A training batch of the case as its trainer's loader gives it, from images [B, 3, H, W] and
    labels [B] on the trainer's device: cached image features for a CACHED case, else K_TRANSFORMS
    views (a list when more than one), the un-augmented image with RETURN_IMG0 and ``batch_keys``."""
    if case.kind == CACHED:
        with torch.no_grad(), trainer.autocast():
            return {"features": trainer.model.encode_image_features(images), "label": labels}
    views = trainer.cfg.DATALOADER.K_TRANSFORMS
    batch = {"img": images if views == 1 else [images] * views, "label": labels}
    if trainer.cfg.DATALOADER.RETURN_IMG0:
        batch["img0"] = images
    if case.batch_keys is not None:
        batch.update({key: value.to(images.device) for key, value in case.batch_keys(trainer, len(images)).items()})
    return batch
