"""PromptKD: Unsupervised Prompt Distillation for Vision-Language Models (Li et al., CVPR 2024).

A frozen teacher, a PromptSRC model trained by this project (upstream: a ViT-L/14 PromptSRC
checkpoint per dataset), distils its predictions into a student that has no text tower:

* student image tower: the student CLIP's image encoder with deep vision prompts
  V_1..V_J [n_v, D_v] (IVLP's: n_v = N_CTX_VISION = 4 tokens, J = PROMPT_DEPTH_VISION = 9
  layers, N(0, 0.02)), its class-token feature f [B, E_s] (after CLIP's ``proj``), then the
  projector g = Linear(E_s, E_t) -> BatchNorm(E_t) -> ReLU -> Linear(E_t, E_t) (upstream: 1x1
  convolutions on [B, E, 1, 1], the same maps and the same default initialisation), E_t the
  teacher's embedding width (ViT-B/16 -> ViT-L/14: 512 -> 768, hidden 768);
* classifier: the teacher's normalised text features t̂_T [C, E_t] of the classes scored
  (PromptSRC's prompted text tower; computed once per class list, the teacher never changes);
  z_S = s_S · ĝ(f) · t̂_Tᵀ with the student CLIP's scale s_S (100 for OpenAI weights);
* teacher logits on the same augmented images: z_T = s_T · f̂_T · t̂_Tᵀ (PromptSRC's prompted
  image tower, under no_grad);
* loss, no cross-entropy and no labels: L = w · KL(softmax(z_T/τ) ‖ softmax(z_S/τ)) · τ² / (B·C)
  (KL summed over the batch, divided by numel(z_S)), τ = TEMPERATURE = 1, w = KD_WEIGHT
  (upstream's script: 200 for FGVCAircraft, OxfordFlowers, DescribableTextures, 1000 for the
  other eight datasets; KD_WEIGHT auto reads that table by DATASET.NAME).

Transductive training (TRANSDUCTIVE True, upstream's setting): the student trains on the
unlabelled training images of ALL classes, base and new. The training run of base-to-novel is
still a ``DATASET.SUBSAMPLE_CLASSES base`` run (the protocol's split, its final test the Base
accuracy); this trainer replaces only its training loader by the training images of every
class (the dataset rebuilt with SUBSAMPLE_CLASSES all and NUM_SHOTS UNLABELLED_SHOTS: 0 = every
training image, upstream's ``DATASET.NUM_SHOTS 0``; K >= 1 = K per class), and while training
the classifier is the teacher's text features of all those classes. Labels are never used
(only the progress line's accuracy reads them). Evaluation keeps the protocol's split: an
evaluation scores the classes of its own split with their teacher text features, so the base
test uses the base classes' features and the new test (an ``--eval-only`` run with
SUBSAMPLE_CLASSES new) the new classes' ones, as upstream's ``test`` (first ⌈C/2⌉ rows for
base, the rest for new). With TRANSDUCTIVE False the student trains on the run's own training
set (e.g. only the base classes' 16 shots) against the teacher features of those classes.

Epoch selection: upstream evaluates the base TEST split after every epoch (its config
``TEST.FINAL_MODEL best_val`` with val = base test) and reports the best epoch, i.e. it selects
the epoch on test data. This trainer does not: it uses the last epoch (TEST.FINAL_MODEL
last_step), as every method of this project.

Teacher (TEACHER_DIR): the folder of a PromptSRC training run of this project (train.py or
tools/run_protocol.py) on the same dataset: its ``config.yaml`` gives backbone, prompt sizes and
epochs, ``VLPromptLearner/model.pth.tar-<OPTIM.MAX_EPOCH>`` the trained prompts (with GPA, the
aggregate), ``results.json`` the number of classes it was trained on. The path may contain
``{dataset}`` (the dataset YAML stem under configs/datasets, the folder name run_protocol uses),
``{name}`` (DATASET.NAME) and ``{seed}`` (SEED), so one value serves a protocol grid. A folder in
upstream's format is read too: ``teacher_model/<DATASET.NAME>/VLPromptLearner/model-best.pth.tar``
(the authors' ViT-L/14 teachers; TEACHER_DIR ``teacher_model/{name}``), the whole PromptSRC model
under upstream's names, with TEACHER_BACKBONE / TEACHER_WEIGHTS as its CLIP, prompt sizes and depths
from its prompts and its base-class count from its ``prompt_learner.token_prefix``. A missing
folder or checkpoint, a teacher of another trainer or dataset, or one whose class count does not
match this dataset's is a ConfigError naming the path and the command that trains the teacher.

Verified by reading the official code (zhengli97/PromptKD @ ec244f78): trainers/promptkd.py
(``Feature_Trans_Module_two_layer(512, 768)``: conv 1x1 -> BN -> ReLU -> conv 1x1 on the
student's image feature; the student CLIP is built with IVLP's vision prompts, depth 9, 4
tokens, and only its image encoder is used; ``forward_backward``: teacher logits under no_grad,
``stu_logits = logit_scale * image_ft @ tea_text_features.t()``, ``F.kl_div(log_softmax(stu/T),
softmax(tea/T), reduction='sum') * T * T / stu_logits.numel()`` times KD_WEIGHT; ``test``:
base rows ⌈C/2⌉ for split val (the base test), the rest for split test (the new test)),
datasets/*.py (``train_x`` = all classes, ``val`` = base test, ``test`` = new test, for
PromptKD in base2novel), scripts/promptkd/base2new_train.sh (NUM_SHOTS 0, T 1, KD_WEIGHT 1000;
200 for fgvc_aircraft, oxford_flowers, dtd), configs/trainers/PromptKD/
vit_b16_c2_ep20_batch8_4+4ctx.yaml (SGD lr 0.005, 20 epochs, batch 8, cosine, warm-up 1 epoch
constant 1e-5, fp16, FINAL_MODEL best_val).
Run side by side with that code (tools/official_equivalence.py PromptKD, module
vlprompt_app/fidelity/methods/promptkd.py, fixture tests/fixtures/official/promptkd.json): its student
CustomCLIP on a seeded random ViT-B/16 and its CustomCLIP_teacher on a seeded random CLIP with
ViT-L/14's embedding width 768, every prompt and the projector at 10x their init std, 2 images and
3 classes; base logits, new logits, teacher logits and the distillation loss agree (relative max
differences in docs/fidelity.md). tests/test_promptkd.py also computes the equations above independently
from the trainer's pieces.

Differences from upstream besides the epoch selection: PREC fp16 is autocast with fp32 master
weights (upstream casts the student, projector included, to fp16); the teacher's text features
are computed once per class list (upstream re-encodes them at every step and also runs the
teacher's image tower at test time, unused); the projector's widths follow the two backbones
(upstream hard-codes 512 -> 768). The dataset of an upstream-format teacher folder cannot be
checked (only the folder's name says it); its class count is.
"""
import os
import os.path as osp
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
import yaml
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, Tokenizer, check_prompt_sizes, load_clip, prompt_parameters
from vlprompt.clip import CLIPRunner, UnsupportedBackboneError, vision_prompt_plan
from vlprompt.config import (
    ConfigError, check_range, extend_cfg, get_cfg_default, merge_from_file, register_cfg_extension,
)
from vlprompt.data import DataManager
from vlprompt.data.checks import check_images
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule
from vlprompt.engine.run_folder import CONFIG_FILENAME, RESULTS_FILENAME, RunFolder
from vlprompt.methods.independent_prompts import IVLPCLIP
from vlprompt.paths import repository_root
from vlprompt.utils import load_checkpoint, save_checkpoint


# DATASET.NAME -> KD weight w of upstream's scripts/promptkd/base2new_train.sh.
KD_WEIGHTS = {
    "FGVCAircraft": 200.0, "OxfordFlowers": 200.0, "DescribableTextures": 200.0,
    "ImageNet": 1000.0, "Caltech101": 1000.0, "EuroSAT": 1000.0, "Food101": 1000.0, "OxfordPets": 1000.0,
    "StanfordCars": 1000.0, "SUN397": 1000.0, "UCF101": 1000.0,
}
KD_WEIGHT_RULE = DatasetRule("TRAINER.PROMPTKD.KD_WEIGHT", KD_WEIGHTS, source="trainers.promptkd.KD_WEIGHTS")
TEACHER_TRAINER = "PromptSRC"
TEACHER_MODEL_NAME = "VLPromptLearner"  # the model name PromptSRC registers (its checkpoint folder)
TEACHER_DIR_FIELDS = ("dataset", "name", "seed")


@register_cfg_extension
def add_promptkd_config(cfg):
    cfg.TRAINER.PROMPTKD = CN()
    cfg.TRAINER.PROMPTKD.N_CTX_VISION = 4  # vision prompt tokens per layer
    cfg.TRAINER.PROMPTKD.PROMPT_DEPTH_VISION = 9  # layers with vision prompts (>= 1)
    cfg.TRAINER.PROMPTKD.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.PROMPTKD.TEMPERATURE = 1.0  # τ of the distillation
    cfg.TRAINER.PROMPTKD.KD_WEIGHT = "auto"  # w; auto: from KD_WEIGHTS by DATASET.NAME
    cfg.TRAINER.PROMPTKD.TEACHER_DIR = ""  # PromptSRC run folder; may hold {dataset}, {name} and {seed}
    cfg.TRAINER.PROMPTKD.TEACHER_BACKBONE = "ViT-L/14"  # backbone of an upstream-format teacher folder
    cfg.TRAINER.PROMPTKD.TEACHER_WEIGHTS = ""  # its CLIP weights (MODEL.BACKBONE.WEIGHTS semantics)
    cfg.TRAINER.PROMPTKD.TRANSDUCTIVE = True  # train on the unlabelled training images of all classes
    cfg.TRAINER.PROMPTKD.UNLABELLED_SHOTS = 0  # images per class of that set; 0 = all of them


def kd_weight(value, dataset):
    """w: ``value`` (TRAINER.PROMPTKD.KD_WEIGHT), or for ``auto`` the KD_WEIGHTS entry of ``dataset``.

    Raises:
        ConfigError: ``auto`` for a dataset outside KD_WEIGHTS, or w < 0.
    """
    weight = KD_WEIGHT_RULE.resolve(value, dataset)
    check_range("TRAINER.PROMPTKD.KD_WEIGHT", weight, minimum=0.0)
    return float(weight)


def distillation_loss(student_logits, teacher_logits, temperature):
    """KL(softmax(z_T/τ) ‖ softmax(z_S/τ)) summed over the batch, times τ² / numel(z_S).

    Args:
        student_logits, teacher_logits: [B, C]. temperature: τ > 0.
    Returns:
        0-dim float32 tensor (differentiable in ``student_logits``).
    """
    log_student = F.log_softmax(student_logits.float() / temperature, dim=1)
    teacher = F.softmax(teacher_logits.float() / temperature, dim=1)
    return F.kl_div(log_student, teacher, reduction="sum") * temperature ** 2 / student_logits.numel()


def split_size(num_classes, subsample):
    """Number of classes of DATASET.SUBSAMPLE_CLASSES ``subsample`` among ``num_classes`` (base = first ⌈C/2⌉)."""
    base = -(-num_classes // 2)
    return {"all": num_classes, "base": base, "new": num_classes - base}[subsample]


# ----------------------------------------------------------------------------------------------
# The teacher: a PromptSRC run folder of this project
# ----------------------------------------------------------------------------------------------
def dataset_config_stem(dataset_name, folder=None):
    """The stem of the YAML under ``folder`` (default configs/datasets) whose DATASET.NAME is ``dataset_name``."""
    folder = folder or osp.join(repository_root(), "configs", "datasets")
    stems = []
    for name in sorted(os.listdir(folder)) if osp.isdir(folder) else []:
        if name.endswith(".yaml"):
            with open(osp.join(folder, name), encoding="utf-8") as f:
                content = yaml.safe_load(f) or {}
            if (content.get("DATASET") or {}).get("NAME") == dataset_name:
                stems.append(name[: -len(".yaml")])
    if len(stems) != 1:
        found = "none" if not stems else ", ".join(stems)
        raise ConfigError(
            f"TRAINER.PROMPTKD.TEACHER_DIR uses {{dataset}}, the YAML stem under {folder} of DATASET.NAME "
            f"{dataset_name!r}, but exactly one such file is needed (found: {found}); write the folder without "
            "{dataset}."
        )
    return stems[0]


def resolve_teacher_dir(template, dataset_name, seed):
    """TEACHER_DIR with ``{dataset}`` (dataset YAML stem), ``{name}`` (DATASET.NAME) and ``{seed}`` (SEED) filled in."""
    if not template:
        raise ConfigError(
            "TRAINER.PROMPTKD.TEACHER_DIR is empty: give the folder of a PromptSRC training run on this dataset "
            "(it may contain {dataset} and {seed}, e.g. OUT/base2new/train_base/{dataset}/shots_16/PromptSRC/"
            "vit_b16_c2_ep20_batch4_4+4ctx/seed{seed})."
        )
    try:
        fields = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as error:
        raise ConfigError(f"TRAINER.PROMPTKD.TEACHER_DIR {template!r} is not a valid template: {error}.") from None
    unknown = sorted(fields - set(TEACHER_DIR_FIELDS))
    if unknown:
        raise ConfigError(
            f"TRAINER.PROMPTKD.TEACHER_DIR {template!r} has unknown placeholders {unknown}; "
            f"only {{{'}, {'.join(TEACHER_DIR_FIELDS)}}} are filled in."
        )
    values = {"seed": seed, "name": dataset_name}
    if "dataset" in fields:
        values["dataset"] = dataset_config_stem(dataset_name)
    return template.format(**values)


_SHOTS_PART = re.compile(r"^shots_(\d+)$")
_SEED_PART = re.compile(r"^seed(\d+)$")


def teacher_command(folder, dataset_name, seed, data_root):
    """The train.py command that writes the PromptSRC teacher ``folder``.

    A folder of the base-to-novel layout that tools/run_protocol.py writes,
    ``.../base2new/train_base/DATASET/shots_K/PromptSRC/CFG/seedS``, names the teacher's dataset
    YAML, shots, config and seed, and the command trains exactly that run (on ``data_root``, this
    run's DATASET.ROOT); for any other folder the config is the user's to choose (the command says
    so) and the dataset and seed are this run's.
    """
    tail = Path(folder).parts[-7:]
    shots = _SHOTS_PART.match(tail[3]) if len(tail) == 7 else None
    seed_part = _SEED_PART.match(tail[6]) if len(tail) == 7 else None
    if tail[:2] == ("base2new", "train_base") and tail[4] == TEACHER_TRAINER and shots and seed_part:
        dataset = f"configs/datasets/{tail[2]}.yaml"
        config = f"configs/trainers/{TEACHER_TRAINER}/{tail[5]}.yaml"
        shots, seed, choose = shots.group(1), seed_part.group(1), ""
    else:
        try:
            dataset = f"configs/datasets/{dataset_config_stem(dataset_name)}.yaml"
        except ConfigError:
            dataset = "<the dataset's YAML>"
        config = f"configs/trainers/{TEACHER_TRAINER}/CONFIG.yaml"
        shots = "16"
        choose = (f" (CONFIG: the teacher's config under configs/trainers/{TEACHER_TRAINER}, e.g. "
                  "vit_l14_c2_ep20_batch8_4+4ctx, upstream's ViT-L/14 teacher)")
    return (
        f"python train.py --root {shlex.quote(str(data_root))} --trainer {TEACHER_TRAINER} "
        f"--dataset-config-file {dataset} --config-file {config} --seed {seed} "
        f"--output-dir {shlex.quote(str(folder))} DATASET.NUM_SHOTS {shots} DATASET.SUBSAMPLE_CLASSES base{choose}"
    )


@dataclass(frozen=True)
class TeacherRun:
    """What a teacher run folder holds.

    Attributes:
        folder: the run folder. cfg: its merged config (``config.yaml``).
        checkpoint: ``folder/VLPromptLearner/model.pth.tar-<OPTIM.MAX_EPOCH>``.
        num_classes: classes it was trained on (its ``results.json``; None without one).
        command: the command that makes such a teacher (for error messages).
    """

    folder: str
    cfg: CN
    checkpoint: str
    num_classes: Optional[int]
    command: str

    @property
    def subsample(self):
        return self.cfg.DATASET.SUBSAMPLE_CLASSES

    def check_class_count(self, expected, what):
        """ConfigError when the teacher's recorded class count differs from ``expected`` (``what`` names them)."""
        if self.num_classes is not None and self.num_classes != expected:
            raise ConfigError(
                f'The PromptKD teacher "{self.folder}" was trained on {self.num_classes} classes '
                f"({self.cfg.DATASET.NAME}, SUBSAMPLE_CLASSES {self.subsample}, its {RESULTS_FILENAME}), but "
                f"{what} are {expected}: its class list does not match this dataset's. Train the teacher on "
                f"this dataset's split: {self.command}"
            )


def read_teacher_run(folder, dataset_name, input_size, seed, node, data_root):
    """Check the teacher folder and read it (see module docstring); ConfigError naming what is wrong
    and the command that trains the teacher (on ``data_root``, this run's DATASET.ROOT).

    ``node`` (cfg.TRAINER.PROMPTKD) gives TEACHER_BACKBONE / TEACHER_WEIGHTS for an upstream-format folder.
    """
    command = teacher_command(folder, dataset_name, seed, data_root)
    where = f'The PromptKD teacher folder "{folder}" (TRAINER.PROMPTKD.TEACHER_DIR)'
    if not osp.isdir(folder):
        raise ConfigError(f"{where} does not exist. Train the {TEACHER_TRAINER} teacher first: {command}")
    run = RunFolder(folder)
    config_path = run.config_path
    if not config_path.is_file():
        upstream = str(run.checkpoint_path(TEACHER_MODEL_NAME))  # upstream's best checkpoint: Dassl's layout
        if osp.isfile(upstream):
            return read_upstream_teacher(folder, upstream, dataset_name, input_size, node, command)
        raise ConfigError(
            f"{where} has neither {CONFIG_FILENAME} (a training run of this project: train.py writes "
            f'{config_path} when it trains) nor upstream\'s teacher checkpoint "{upstream}". Train the teacher: '
            f"{command}"
        )
    cfg = run.read_config()
    if cfg.TRAINER.NAME != TEACHER_TRAINER:
        raise ConfigError(f"{where} is a {cfg.TRAINER.NAME} run ({config_path}); the teacher must be a "
                          f"{TEACHER_TRAINER} run: {command}")
    if cfg.DATASET.NAME != dataset_name:
        raise ConfigError(f"{where} was trained on {cfg.DATASET.NAME} ({config_path}), this run uses "
                          f"{dataset_name}: its classes do not match. Train a teacher on {dataset_name}: {command}")
    if tuple(cfg.INPUT.SIZE) != tuple(input_size):
        raise ConfigError(f"{where} takes {tuple(cfg.INPUT.SIZE)} images (INPUT.SIZE in {config_path}), this run "
                          f"{tuple(input_size)}; the teacher sees the student's images, so the sizes must agree.")
    checkpoint = str(run.checkpoint_path(TEACHER_MODEL_NAME, cfg.OPTIM.MAX_EPOCH))
    if not osp.isfile(checkpoint):
        raise ConfigError(
            f'The PromptKD teacher checkpoint "{checkpoint}" (the last epoch, OPTIM.MAX_EPOCH '
            f"{cfg.OPTIM.MAX_EPOCH} of {config_path}) is missing: the teacher run has not finished. "
            f"Train it (again): {command}"
        )
    return TeacherRun(folder, cfg, checkpoint, run.trained_class_count(), command)


def read_upstream_teacher(folder, checkpoint, dataset_name, input_size, node, command):
    """A teacher in upstream's format (``teacher_model/<DATASET.NAME>/VLPromptLearner/model-best.pth.tar``,
    the whole PromptSRC CLIP saved by upstream's code): backbone TEACHER_BACKBONE / TEACHER_WEIGHTS, prompt
    sizes and depths read from the checkpoint's prompts, the classes it was trained on from the rows of its
    ``prompt_learner.token_prefix`` (its base classes: SUBSAMPLE_CLASSES base)."""
    state = load_checkpoint(checkpoint)["state_dict"]
    if "prompt_learner.ctx" not in state or "image_encoder.VPT" not in state:
        raise ConfigError(f'"{checkpoint}" holds no PromptSRC prompts (prompt_learner.ctx, image_encoder.VPT): '
                          f"it is not an upstream PromptSRC teacher. Train a teacher: {command}")
    deep = {tower: sum(1 for key in state if key.startswith(f"{tower}.transformer.resblocks.")
                       and key.endswith(".VPT_shallow")) for tower in ("image_encoder", "text_encoder")}
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.TRAINER.NAME, cfg.DATASET.NAME, cfg.DATASET.SUBSAMPLE_CLASSES = TEACHER_TRAINER, dataset_name, "base"
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = node.TEACHER_BACKBONE, node.TEACHER_WEIGHTS
    cfg.INPUT.SIZE = tuple(input_size)
    teacher_node = cfg.TRAINER.PROMPTSRC
    teacher_node.N_CTX_TEXT = state["prompt_learner.ctx"].shape[0]
    teacher_node.N_CTX_VISION = state["image_encoder.VPT"].shape[0]
    teacher_node.PROMPT_DEPTH_TEXT = 1 + deep["text_encoder"]
    teacher_node.PROMPT_DEPTH_VISION = 1 + deep["image_encoder"]
    teacher_node.CTX_INIT = "a photo of a"
    prefix = state.get("prompt_learner.token_prefix")
    return TeacherRun(folder, cfg, checkpoint, None if prefix is None else prefix.shape[0], command)


def teacher_clip(backbone, weights, device):
    """The frozen CLIP of a PromptSRC teacher as a CLIPRunner; UnsupportedBackboneError for an image
    tower the runner does not drive (the teacher's vision prompts need one)."""
    clip_model, _ = load_clip(backbone, weights, device=device)
    clip = CLIPRunner(clip_model)
    if clip.visual is None:
        raise UnsupportedBackboneError(f"The PromptKD teacher's backbone {backbone} is not a ViT.")
    return clip


def write_stand_in_teacher(folder, backbone, weights, input_size, dataset):
    """Write a PromptSRC run folder with untrained prompts (N(0, 0.02), "a photo of a") for timing
    PromptKD without training a teacher (tools/benchmark.py): ``config.yaml`` (PromptSRC's ViT-B/16
    base-to-novel recipe with ``backbone``, ``weights``, ``input_size``, DATASET.NAME ``dataset``)
    and ``VLPromptLearner/model.pth.tar-<OPTIM.MAX_EPOCH>``. Returns ``folder``."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, osp.join(repository_root(), "configs", "trainers", TEACHER_TRAINER,
                                  "vit_b16_c2_ep20_batch4_4+4ctx.yaml"))
    cfg.TRAINER.NAME, cfg.DATASET.NAME = TEACHER_TRAINER, dataset
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = backbone, weights
    cfg.INPUT.SIZE = tuple(input_size)
    clip = teacher_clip(backbone, weights, "cpu")
    model = IVLPCLIP(clip, Tokenizer(backbone), ["stand-in"], cfg.TRAINER.PROMPTSRC)
    prompts = {name: param.detach() for name, param in model.named_parameters() if param.requires_grad}
    run = RunFolder(folder)
    checkpoint = run.checkpoint_path(TEACHER_MODEL_NAME, cfg.OPTIM.MAX_EPOCH)
    save_checkpoint({"state_dict": prompts, "epoch": cfg.OPTIM.MAX_EPOCH}, str(checkpoint.parent),
                    model_name=checkpoint.name)
    run.write_config(cfg)
    return folder


class PromptSRCTeacher(nn.Module):
    """The frozen PromptSRC model of a teacher run (its IVLP parameterisation at inference).

    Args:
        run: TeacherRun. classnames: an initial class list. device: torch.device.

    Attributes:
        model: IVLPCLIP with the run's trained prompts, frozen, in eval mode.
        embed_dim: E_t, width of its features.
    """

    def __init__(self, run, classnames, device):
        super().__init__()
        backbone = run.cfg.MODEL.BACKBONE
        print(f"PromptKD teacher: {run.checkpoint} ({backbone.NAME})")
        clip = teacher_clip(backbone.NAME, backbone.WEIGHTS, device)
        self.model = IVLPCLIP(clip, Tokenizer(backbone.NAME), classnames, run.cfg.TRAINER.PROMPTSRC).to(device)
        state_dict = load_checkpoint(run.checkpoint)["state_dict"]
        learned = {name for name, param in self.model.named_parameters() if param.requires_grad}
        try:
            result = self.model.load_state_dict(state_dict, strict=False)  # upstream names are mapped to ours
        except RuntimeError as error:
            raise ConfigError(f'The PromptKD teacher checkpoint "{run.checkpoint}" does not fit the prompts '
                              f"of its run folder: {error}") from None
        missing = sorted(learned & set(result.missing_keys))
        if missing:
            raise ConfigError(f'The PromptKD teacher checkpoint "{run.checkpoint}" lacks {missing}: '
                              "it does not hold the prompts its run folder describes.")
        self.model.requires_grad_(False)
        self.model.eval()
        self.embed_dim = clip.visual.output_dim
        self._text = {}

    def train(self, mode=True):
        return super().train(False)  # the teacher never trains

    def forget_text_features(self):
        """Drop the text features kept per class list (after the teacher's prompts were written in place)."""
        self._text = {}

    @torch.no_grad()
    def text_features(self, classnames):
        """t̂_T [C, E_t] (fp32, normalised) of ``classnames``, computed once per class list (until
        ``forget_text_features``)."""
        key = tuple(classnames)
        if key not in self._text:
            device = self.model.clip.logit_scale.device
            with torch.autocast(device.type, enabled=False):
                self.model.prompt_learner.set_classnames(list(classnames))
                self._text[key] = F.normalize(self.model.compute_text_features().float(), dim=-1)
        return self._text[key]

    @torch.no_grad()
    def logits(self, images, text_features):
        """z_T = s_T · f̂_T · t̂_Tᵀ [B, C] of ``images`` [B, 3, H, W]."""
        image_features = self.model.image_features(images)
        return self.model.cosine_logits(image_features, text_features.to(image_features.dtype))


# ----------------------------------------------------------------------------------------------
# The student
# ----------------------------------------------------------------------------------------------
class Projector(nn.Sequential):
    """g: [B, E_s] -> Linear(E_s, E_t) -> BatchNorm(E_t) -> ReLU -> Linear(E_t, E_t) -> [B, E_t]."""

    def __init__(self, in_dim, out_dim):
        super().__init__(nn.Linear(in_dim, out_dim), nn.BatchNorm1d(out_dim), nn.ReLU(inplace=True),
                         nn.Linear(out_dim, out_dim))


class PromptKDCLIP(PromptedCLIP):
    """The student: prompted image tower + projector, scored against the teacher's text features.

    Args:
        clip: the student's CLIPRunner. teacher: PromptSRCTeacher (kept outside the module tree:
            never trained, never saved with the student). classnames: the scored classes.
        node: cfg.TRAINER.PROMPTKD. weight: w.

    Attributes:
        vision_prompts: V_1..V_J, J Parameters [n_v, D_v]. projector: Projector(E_s, E_t).
        classnames: the classes scored now (``use_classes``).
    """

    def __init__(self, clip, teacher, classnames, node, weight):
        super().__init__(clip)
        self.vision_prompts = prompt_parameters(node.PROMPT_DEPTH_VISION, node.N_CTX_VISION, clip.visual.width)
        self.projector = Projector(clip.visual.output_dim, teacher.embed_dim)
        object.__setattr__(self, "teacher", teacher)
        self.temperature = node.TEMPERATURE
        self.weight = weight
        self.classnames = list(classnames)

    def use_classes(self, classnames):
        """Score ``classnames`` from now on (their teacher text features are the classifier)."""
        self.classnames = list(classnames)
        self._eval_text_features = None

    def compute_text_features(self):
        return self.teacher.text_features(self.classnames)

    def image_features(self, images):
        """ĝ(f): normalised projected features [B, E_t] of ``images`` [B, 3, H, W]."""
        features = self.clip.encode_image(images, vision_prompt_plan(self.vision_prompts))
        return F.normalize(self.projector(features), dim=-1)

    def forward(self, images):
        return self.cosine_logits(self.image_features(images), self.class_text_features())

    def loss(self, images, labels):
        """(w · distillation loss, z_S [B, C], {"kd": the unweighted loss}); ``labels`` are not used."""
        text_features = self.class_text_features()
        teacher_logits = self.teacher.logits(images, text_features)
        logits = self.cosine_logits(self.image_features(images), text_features)
        kd = distillation_loss(logits, teacher_logits, self.temperature)
        return self.weight * kd, logits, {"kd": kd.detach()}


def stand_in_teacher_options(settings, output_dir):
    """The cost benchmark's teacher (its case's ``prepare``): a stand-in PromptSRC run of the benchmark's
    backbone (untrained prompts; the step's cost does not depend on their values); returns its
    TEACHER_DIR override."""
    size = (settings["image_size"], settings["image_size"])
    folder = write_stand_in_teacher(osp.join(output_dir, "promptkd_teacher"), settings["backbone"],
                                    settings["weights"], size, "OxfordPets")
    return ("TRAINER.PROMPTKD.TEACHER_DIR", folder)


@TRAINER_REGISTRY.register()
class PromptKD(ClipTrainer):
    """PromptKD trainer; the student (prompts, projector) is registered as "VLPromptLearner", as upstream.

    Attributes:
        teacher_run: TeacherRun. train_classnames: the classes the student trains against
            (all classes with TRANSDUCTIVE, else the run's own).
    """

    # The KD weight is per dataset and the teacher a PromptSRC run of that dataset: the benchmark's
    # stand-in classes take the Pets weight, the teacher is PromptSRC with untrained prompts on the
    # same backbone.
    benchmark_cases = (
        Case("PromptKD/vit_b16_c2_ep20_batch8_4+4ctx.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets"),
             prepare=stand_in_teacher_options),
    )

    vit_required_for = "deep vision prompts"

    def check_cfg(self, cfg):
        node = cfg.TRAINER.PROMPTKD
        check_prompt_sizes(cfg, "PROMPTKD", vision=("PROMPT_DEPTH_VISION", "N_CTX_VISION"))
        check_range("TRAINER.PROMPTKD.TEMPERATURE", node.TEMPERATURE, minimum=1e-6)
        check_range("TRAINER.PROMPTKD.UNLABELLED_SHOTS", node.UNLABELLED_SHOTS, minimum=0,
                    why="0 takes every training image, K >= 1 K per class.")
        kd_weight(node.KD_WEIGHT, cfg.DATASET.NAME)
        resolve_teacher_dir(node.TEACHER_DIR, cfg.DATASET.NAME, cfg.SEED)

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.PROMPTKD
        clip, _ = self.build_clip()
        folder = resolve_teacher_dir(node.TEACHER_DIR, cfg.DATASET.NAME, cfg.SEED)
        self.teacher_run = read_teacher_run(folder, cfg.DATASET.NAME, cfg.INPUT.SIZE, cfg.SEED, node,
                                            cfg.DATASET.ROOT)
        if self.teacher_run.subsample == cfg.DATASET.SUBSAMPLE_CLASSES:
            self.teacher_run.check_class_count(
                len(self.classnames), f"the {cfg.DATASET.SUBSAMPLE_CLASSES} classes of {cfg.DATASET.NAME} here")
        teacher = PromptSRCTeacher(self.teacher_run, self.classnames, self.device)
        weight = kd_weight(node.KD_WEIGHT, cfg.DATASET.NAME)
        print(KD_WEIGHT_RULE.describe(node.KD_WEIGHT, cfg.DATASET.NAME))
        self.model = PromptKDCLIP(clip, teacher, self.classnames, node, weight).to(self.device)
        self.register_learner("VLPromptLearner", self.model)
        self.train_classnames = self.classnames
        print(f"PromptKD: KD weight {weight}, temperature {node.TEMPERATURE}, "
              f"transductive {node.TRANSDUCTIVE}, projector {clip.visual.output_dim} -> {teacher.embed_dim}")

    def before_train(self):
        if self.cfg.TRAINER.PROMPTKD.TRANSDUCTIVE:
            self.use_unlabelled_training_images()
        super().before_train()

    def use_unlabelled_training_images(self):
        """Train on the training images of every class (SUBSAMPLE_CLASSES all, NUM_SHOTS UNLABELLED_SHOTS)."""
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.DATASET.SUBSAMPLE_CLASSES = "all"
        cfg.DATASET.NUM_SHOTS = self.cfg.TRAINER.PROMPTKD.UNLABELLED_SHOTS
        cfg.freeze()
        dm = DataManager(cfg)
        names = [name.replace("_", " ") for name in dm.dataset.classnames]
        self.teacher_run.check_class_count(split_size(len(names), self.teacher_run.subsample),
                                           f"the {self.teacher_run.subsample} classes of {cfg.DATASET.NAME} here")
        check_images({"train": dm.dataset.train_x}, cfg.DATASET.CHECK_IMAGES, skip=cfg.DATASET.SKIP_BAD_IMAGES,
                     report_dir=self.output_dir)
        self.train_loader_x = dm.train_loader_x
        self.train_classnames = names
        print(f"PromptKD: transductive training on {len(dm.dataset.train_x)} unlabelled training images of all "
              f"{len(names)} classes (the evaluation keeps SUBSAMPLE_CLASSES {self.cfg.DATASET.SUBSAMPLE_CLASSES})")

    def before_epoch(self):
        self.model.use_classes(self.train_classnames)
        super().before_epoch()

    def test(self, split=None):
        self.model.use_classes(self.classnames)
        return super().test(split)
