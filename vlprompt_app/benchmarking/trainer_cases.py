"""The per-trainer cases of ``tools/benchmark.py trainers`` and how a case's trainer is built.

Every trainer of the ``trainers`` package needs a case (its ViT-B/16 config, its kind and
the project's targets): ``check_coverage`` fails with the names of the trainers without one, so
a new trainer makes the benchmark (and tests/test_benchmark.py) fail until its case is added.
``build_trainer`` builds a case's trainer through its own class from its config, with
synthetic class names instead of a dataset.
"""
import contextlib
import io
import os.path as osp
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Optional, Tuple

import torch

from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.paths import repository_root

ROOT = str(repository_root())

TRAIN, CACHED, EVAL_ONLY, TEST_TIME = "train", "cached", "eval-only", "test-time"
OFFICIAL_EVAL = "2.8-3.3"  # the official implementations re-encode every class text per batch


@dataclass(frozen=True)
class Case:
    """One row of the benchmark.

    Attributes:
        name: row name (the trainer's name unless a trainer has several rows).
        trainer: registered trainer name.
        config: config file under configs/trainers/.
        kind: TRAIN (train step from images), CACHED (train step from cached image features),
            EVAL_ONLY (nothing to train) or TEST_TIME (per-image adaptation during test()).
        batch: fixed batch size (the paper's, when the comparison setting uses it); 0 = --batch.
        opts: KEY VALUE config overrides of this case.
        train_target, eval_target: the project's targets of the cost ratios (None: none).
        official_train, official_eval: the official implementations' ratios, measured the same way (PERFORMANCE.md).
        prepare: None, or callable(settings, output_dir) -> more KEY VALUE overrides, for a case
            that needs files before its trainer is built (PromptKD's teacher folder).
        after_build: None, or ``after_build(trainer)``, for what a trainer sets up when training
            starts (e.g. TAC's description embeddings and cluster centres).
        batch_keys: None, or ``batch_keys(trainer, batch_size)`` -> {key: tensor [B]}, what the
            trainer's training loader adds to a batch's images and labels (FLYP's caption templates).
        synthetic: the config of the synthetic benchmark under configs/trainers/ that the
            mixed-precision contract and the CUDA parity build the case from; "" =
            ``synthetic.yaml`` beside ``config``.
        synthetic_opts: KEY VALUE overrides over ``synthetic`` (a variant whose trainer has one
            synthetic config, e.g. DePT on CoOp).
    """

    name: str
    trainer: str
    config: str
    kind: str
    batch: int = 0
    opts: Tuple[str, ...] = ()
    train_target: Optional[float] = None
    eval_target: Optional[float] = 1.15
    official_train: Optional[float] = None
    official_eval: Optional[str] = None
    prepare: Optional[Callable] = None
    after_build: Optional[Callable] = None
    batch_keys: Optional[Callable] = None
    synthetic: str = ""
    synthetic_opts: Tuple[str, ...] = ()

    @property
    def synthetic_config(self):
        """The case's synthetic-benchmark config, relative to configs/trainers/."""
        return self.synthetic or osp.join(osp.dirname(self.config), "synthetic.yaml")


def promptkd_teacher(settings, output_dir):
    """A stand-in PromptSRC teacher of the benchmark's backbone (untrained prompts; the step's cost
    does not depend on their values) for the PromptKD case; returns its TEACHER_DIR override."""
    from trainers.promptkd import write_stand_in_teacher

    size = (settings["image_size"], settings["image_size"])
    folder = write_stand_in_teacher(osp.join(output_dir, "promptkd_teacher"), settings["backbone"],
                                    settings["weights"], size, "OxfordPets")
    return ("TRAINER.PROMPTKD.TEACHER_DIR", folder)


def promptalign_statistics(settings, output_dir):
    """Stand-in source statistics (zero means, unit variances; the step's cost does not depend on their
    values) of the benchmark's backbone with MaPLe's 2 prompt tokens (PromptAlign/vit_b16.yaml) for the
    PromptAlign case; returns its VIS_MEANS / VIS_VARS overrides."""
    from trainers.promptalign import write_source_statistics
    from vlprompt.clip import CLIPRunner, load_clip

    clip_model, _ = load_clip(settings["backbone"], settings["weights"], device="cpu")
    visual = CLIPRunner(clip_model).visual
    shape = (visual.num_layers, visual.positional_embedding.shape[0] + 2, visual.width)
    paths = osp.join(output_dir, "promptalign_means.pt"), osp.join(output_dir, "promptalign_vars.pt")
    write_source_statistics(torch.zeros(shape), torch.ones(shape), *paths)
    return ("TRAINER.PROMPTALIGN.VIS_MEANS", paths[0], "TRAINER.PROMPTALIGN.VIS_VARS", paths[1])


def _fit_tac_descriptions(trainer):
    """TAC's before_train step with one description per stand-in class ("a photo of a class number i.")."""
    descriptions = [[f"a photo of a {name}."] for name in trainer.classnames]
    trainer.model.fit_descriptions(descriptions, torch.Generator().manual_seed(0))


# Every registered trainer needs at least one case: a new trainer makes the benchmark fail
# until its case is added here.
CASES = (
    Case("ZeroshotCLIP", "ZeroshotCLIP", "CoOp/vit_b16.yaml", EVAL_ONLY),
    Case("ZeroshotCLIP2", "ZeroshotCLIP2", "CoOp/vit_b16.yaml", EVAL_ONLY),
    Case("CoOp", "CoOp", "CoOp/vit_b16_ep50_ctxv1.yaml", TRAIN, train_target=2.6, official_train=5.2,
         official_eval=OFFICIAL_EVAL),
    Case("CoCoOp", "CoCoOp", "CoCoOp/vit_b16_c4_ep10_batch1_ctxv1.yaml", TRAIN, batch=1, train_target=8.5,
         eval_target=4.0, official_train=17.0, official_eval="8"),
    Case("KgCoOp", "KgCoOp", "KgCoOp/vit_b16_ep100_ctxv1.yaml", TRAIN),
    Case("ProGrad", "ProGrad", "ProGrad/vit_b16_ep100.yaml", TRAIN),
    # TCP's templates are per dataset: the benchmark's stand-in classes take the Pets ones.
    Case("TCP", "TCP", "TCP/vit_b16_ep100_ctxv1.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),
    Case("MMA", "MMA", "MMA/vit_b16_ep5.yaml", TRAIN),
    # MMRL's λ and representation width are per dataset: the stand-in classes take the Pets ones.
    Case("MMRL", "MMRL", "MMRL/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),
    Case("ProVP", "ProVP", "ProVP/vit_b16_b2n_ep100.yaml", TRAIN),
    # MMRL++'s β and λ are per dataset: the stand-in classes take the Pets ones.
    Case("MMRLpp", "MMRLpp", "MMRLpp/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),
    # PromptKD's KD weight is per dataset and its teacher a PromptSRC run of that dataset: the stand-in
    # classes take the Pets weight, the teacher is PromptSRC with untrained prompts on the same backbone.
    Case("PromptKD", "PromptKD", "PromptKD/vit_b16_c2_ep20_batch8_4+4ctx.yaml", TRAIN,
         opts=("DATASET.NAME", "OxfordPets"), prepare=promptkd_teacher),
    Case("IVLP", "IVLP", "IVLP/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN, train_target=3.3, official_train=6.7,
         official_eval=OFFICIAL_EVAL),
    Case("MaPLe", "MaPLe", "MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml", TRAIN, train_target=3.5, official_train=7.1,
         official_eval=OFFICIAL_EVAL),
    Case("PromptSRC", "PromptSRC", "PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN, train_target=4.0,
         official_train=8.0, official_eval=OFFICIAL_EVAL),
    Case("VPT", "VPT", "VPT/vit_b16_c2_ep5_batch4_4.yaml", TRAIN),
    Case("DePT", "DePT", "DePT/vit_b16_maple.yaml", TRAIN),
    Case("DePT+CoOp", "DePT", "DePT/vit_b16_coop.yaml", TRAIN, synthetic_opts=("TRAINER.DEPT.BASE", "CoOp")),
    # ATPrompt's attribute words are per dataset: the stand-in classes take ImageNet's ("color", "shape").
    Case("ATPrompt", "ATPrompt", "ATPrompt/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "ImageNet")),
    Case("ATPrompt+MaPLe", "ATPrompt", "ATPrompt/vit_b16_maple.yaml", TRAIN, opts=("DATASET.NAME", "ImageNet"),
         synthetic_opts=("TRAINER.ATPROMPT.BASE", "MaPLe", "TRAINER.MAPLE.PROMPT_DEPTH", "3")),
    # Its step starts from images: the frozen lower blocks (what the per-epoch cache costs per image), then
    # the tuned upper blocks with the class-wise skip.
    Case("SkipTuning", "SkipTuning", "SkipTuning/vit_b16_bs4.yaml", TRAIN),
    # TAC's step encodes its 4 augmented views of each image and the un-augmented image.
    Case("TAC", "TAC", "TAC/basetonovel.yaml", TRAIN, after_build=_fit_tac_descriptions),
    Case("DeAR", "DeAR", "DeAR/vit_b16_base2new.yaml", TRAIN, train_target=2.2),
    Case("CLIPAdapter", "CLIPAdapter", "CLIPAdapter/vit_b16.yaml", CACHED),
    Case("RAda", "RAda", "RAda/vit_b16_base2new.yaml", CACHED, train_target=0.05, official_eval="1.05"),
    Case("RAda (images)", "RAda", "RAda/vit_b16_base2new.yaml", TRAIN, official_train=1.04, official_eval="1.05"),
    Case("RAdaAdapter", "RAdaAdapter", "RAdaAdapter/vit_b16_base2new.yaml", CACHED),
    Case("RAdaPrompt", "RAdaPrompt", "RAdaPrompt/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN),
    # The classifier's initialisation (80 templates or one) does not change the step's cost.
    Case("RAdaFFT", "RAdaFFT", "RAdaFFT/vit_b16_stage2.yaml", TRAIN, opts=("TRAINER.RADAFFT.TEMPLATE_ENSEMBLE", "False"),
         synthetic="RAdaFFT/synthetic_stage2.yaml"),
    Case("RAdaFFT stage 1", "RAdaFFT", "RAdaFFT/vit_b16_stage1.yaml", TRAIN,
         opts=("TRAINER.RADAFFT.TEMPLATE_ENSEMBLE", "False"), synthetic="RAdaFFT/synthetic_stage1.yaml"),
    # The full fine-tuning rivals (LP on cached features; the head from one template, as RAdaFFT above).
    Case("FT", "FT", "FT/vit_b16.yaml", TRAIN, opts=("TRAINER.FT.TEMPLATE_ENSEMBLE", "False")),
    Case("LP", "LP", "LP/vit_b16.yaml", CACHED, opts=("TRAINER.LP.TEMPLATE_ENSEMBLE", "False")),
    Case("LPFT", "LPFT", "LPFT/vit_b16_stage2.yaml", TRAIN, opts=("TRAINER.LPFT.TEMPLATE_ENSEMBLE", "False"),
         synthetic="LPFT/synthetic_stage2.yaml"),
    Case("L2SP", "L2SP", "L2SP/vit_b16.yaml", TRAIN, opts=("TRAINER.L2SP.TEMPLATE_ENSEMBLE", "False")),
    Case("WiSEFT", "WiSEFT", "WiSEFT/vit_b16.yaml", TRAIN, opts=("TRAINER.WISEFT.TEMPLATE_ENSEMBLE", "False")),
    # FLYP's loader gives each image one of its templates (80 in vit_b16.yaml; the step encodes B
    # captions and B images).
    Case("FLYP", "FLYP", "FLYP/vit_b16.yaml", TRAIN,
         batch_keys=lambda trainer, size: {"template": torch.arange(size) % len(trainer.model.token_ids)}),
    Case("RAdaTTT", "RAdaTTT", "RAdaTTT/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None),
    Case("TPT", "TPT", "TPT/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None),
    Case("CoCoOp+TPT", "TPT", "TPT/vit_b16_cocoop.yaml", TEST_TIME, batch=1, eval_target=None,
         synthetic="TPT/synthetic_cocoop.yaml"),
    Case("MaPLe+TPT", "TPT", "TPT/vit_b16_maple.yaml", TEST_TIME, batch=1, eval_target=None,
         synthetic="TPT/synthetic_maple.yaml"),
    # MaPLe+TPT's episode plus the alignment, on stand-in source statistics.
    Case("PromptAlign", "PromptAlign", "PromptAlign/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None,
         prepare=promptalign_statistics),
)


class BenchmarkCoverageError(RuntimeError):
    """A registered trainer has no benchmark case, or a case names an unregistered trainer."""


def check_coverage(registered, cases=CASES):
    """Raise BenchmarkCoverageError unless every name in ``registered`` has a case and every
    case's trainer is registered."""
    covered = {case.trainer for case in cases}
    missing = [name for name in registered if name not in covered]
    stale = sorted(covered - set(registered))
    if missing or stale:
        problems = []
        if missing:
            problems.append(f"registered trainer(s) without a benchmark case: {', '.join(missing)}")
        if stale:
            problems.append(f"case(s) for trainer(s) that are not registered: {', '.join(stale)}")
        raise BenchmarkCoverageError(
            "tools/benchmark.py trainers covers every registered trainer, but found " + "; ".join(problems)
            + ". Add (or remove) an entry in CASES of vlprompt_app/benchmarking/trainer_cases.py: "
            "the trainer's ViT-B/16 config, "
            "its kind (train, cached, eval-only or test-time) and the project's targets if any."
        )


def project_trainers():
    """Registered trainers defined in the ``trainers`` package (not ones a test or a user
    script registered for itself), in registration order."""
    return [name for name in TRAINER_REGISTRY.registered_names()
            if TRAINER_REGISTRY.get(name).__module__.split(".")[0] == "trainers"]


def select_cases(names, cases=CASES):
    """The cases whose trainer or case name is in ``names`` (all cases when ``names`` is empty)."""
    if not names:
        return list(cases)
    known = {case.trainer for case in cases} | {case.name for case in cases}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"error: unknown trainer(s) {unknown}; choose among {sorted(known)}")
    return [case for case in cases if case.trainer in names or case.name in names]


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
