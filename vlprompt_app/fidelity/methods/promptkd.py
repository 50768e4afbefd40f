"""PromptKD against zhengli97/PromptKD's trainers/promptkd.py: the student's base and new logits
(official ``test`` with split val, the first ⌈C/2⌉ classes' teacher text features, and split test,
the rest), the teacher's logits over all classes (``CustomCLIP_teacher``) and the distillation loss
of one official ``forward_backward`` (its fp32 branch, the student in training mode), with the
student's vision prompts V_1..V_9 and its projector, and the teacher's PromptSRC prompts (T_1..T_9, V_1..V_9), all drawn away from their init.

The official code reads the student's CLIP from ./clip/ViT-B-16.pt and the teacher's from
./clip/ViT-L-14.pt (relative to the working folder) and fixes the projector at 512 -> 768: the
student is the harness's seeded random CLIP (ViT-B/16's towers at 64 px), the teacher a seeded
random CLIP of ``TEACHER_CONFIG`` (9 + 9 layers of widths 256 / 128, embedding 768 as ViT-L/14's,
the same input size), small enough for a test. On the CPU the official ``.cuda()`` calls are no-ops and the teacher runs in fp32 (cast
before its TextEncoder is built); instead of the official teacher checkpoint (``teacher_model/``)
the mapped prompts are copied in. The official IVLP blocks cast the prompts to fp16 when they
enter the towers (``.half()``), so the prompt values are drawn fp16-representable on both sides.
"""
import functools
import math
import os
import tempfile

import torch
from torch import nn

from vlprompt.fileio import atomic_write
from vlprompt.paths import repository_root
from vlprompt.run_layout import BEST_CHECKPOINT

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, swap
from ..weights import write_weights

TEACHER_CONFIG = os.path.join(str(repository_root()), "tests", "fixtures", "official", "promptkd_teacher_clip.json")
TEACHER_SEED = 4  # seed of the teacher's random weights
DEPTH, N_CTX = 9, 4
TEACHER_TEXT_WIDTH, TEACHER_VISION_WIDTH = 128, 256
STUDENT_EMBED, TEACHER_EMBED = 512, 768
NODE = {"N_CTX_VISION": N_CTX, "PROMPT_DEPTH_VISION": DEPTH, "TEMPERATURE": 1.0, "KD_WEIGHT": 1000.0}
OFFICIAL_NODE = {"N_CTX_VISION": N_CTX, "N_CTX_TEXT": N_CTX, "CTX_INIT": "a photo of a", "PREC": "fp32",
                 "PROMPT_DEPTH_VISION": DEPTH, "PROMPT_DEPTH_TEXT": DEPTH, "PROJECT_LAYER": 2, "CE_WEIGHT": 0.0,
                 "KD_WEIGHT": 1000.0, "TEMPERATURE": 1.0, "TEACHER_NAME": "ViT-L/14"}
_TEMPORARY = {}  # the teacher folder of our side (a TemporaryDirectory, removed at exit)
TEACHER_PROMPTSRC_NODE = {"N_CTX_TEXT": N_CTX, "N_CTX_VISION": N_CTX, "CTX_INIT": "a photo of a",
                          "PROMPT_DEPTH_TEXT": DEPTH, "PROMPT_DEPTH_VISION": DEPTH}


def _prompt(official, width, std=0.02):
    return Learnable(official, std, (N_CTX, width), fp16=True)


def learnables():
    """Our name -> official name, shape, init std: the student ("student.") and the teacher ("teacher.model.")."""
    entries = {"student.vision_prompts.0": _prompt("student.image_encoder.VPT", 768)}
    for k in range(1, DEPTH):
        entries[f"student.vision_prompts.{k}"] = _prompt(
            f"student.image_encoder.transformer.resblocks.{k}.VPT_shallow", 768)
    # Conv 1x1 / Linear default init: U(±1/sqrt(fan_in)), std 1/sqrt(3·fan_in); BatchNorm weight 1, bias 0.
    for ours, official, shape, fan_in in (("0", "0", (TEACHER_EMBED, STUDENT_EMBED), STUDENT_EMBED),
                                          ("3", "3", (TEACHER_EMBED, TEACHER_EMBED), TEACHER_EMBED)):
        std = (3 * fan_in) ** -0.5
        entries[f"student.projector.{ours}.weight"] = Learnable(
            f"student.VPT_image_trans.conv1.{official}.weight", std, shape)
        entries[f"student.projector.{ours}.bias"] = Learnable(
            f"student.VPT_image_trans.conv1.{official}.bias", std, shape[:1])
    entries["student.projector.1.weight"] = Learnable("student.VPT_image_trans.conv1.1.weight", 0.02,
                                                      (TEACHER_EMBED,), init_mean=1.0)
    entries["student.projector.1.bias"] = Learnable("student.VPT_image_trans.conv1.1.bias", 0.02, (TEACHER_EMBED,))
    entries["teacher.model.prompt_learner.ctx"] = _prompt("teacher.prompt_learner.ctx", TEACHER_TEXT_WIDTH)
    for k in range(DEPTH - 1):
        entries[f"teacher.model.text_prompts.{k}"] = _prompt(
            f"teacher.text_encoder.transformer.resblocks.{k + 1}.VPT_shallow", TEACHER_TEXT_WIDTH)
    entries["teacher.model.vision_prompts.0"] = _prompt("teacher.image_encoder.VPT", TEACHER_VISION_WIDTH)
    for k in range(1, DEPTH):
        entries[f"teacher.model.vision_prompts.{k}"] = _prompt(
            f"teacher.image_encoder.transformer.resblocks.{k}.VPT_shallow", TEACHER_VISION_WIDTH)
    return entries


def official_learnable(name):
    """The official trainer trains the student's parameters named *VPT* (prompts and projector);
    the teacher's PromptSRC learned its ctx and its *VPT* prompts."""
    return "VPT" in name or name == "teacher.prompt_learner.ctx"


def _write_teacher_weights(path):
    write_weights(TEACHER_CONFIG, TEACHER_SEED, path)


class StudentAndTeacher(nn.Module):
    """Our side as one module, so that the harness finds both sides' learnables by name."""

    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher


@functools.lru_cache(maxsize=None)
def _teacher_folder():
    """A run-like teacher folder, written once per process (removed at exit): the random teacher
    CLIP and a checkpoint of zero prompts, which the harness overwrites by name. -> (folder, cfg, checkpoint)."""
    from vlprompt.config import extend_cfg, get_cfg_default
    from vlprompt.utils import save_checkpoint

    folder = _TEMPORARY.setdefault("teacher", tempfile.TemporaryDirectory(prefix="promptkd_teacher_")).name
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = TEACHER_CONFIG, os.path.join(folder, "teacher.pt")
    _write_teacher_weights(cfg.MODEL.BACKBONE.WEIGHTS)
    cfg.TRAINER.PROMPTSRC.merge_from_other_cfg(type(cfg)(TEACHER_PROMPTSRC_NODE))
    zeros = {"prompt_learner.ctx": torch.zeros(N_CTX, TEACHER_TEXT_WIDTH)}
    zeros.update({f"text_prompts.{k}": torch.zeros(N_CTX, TEACHER_TEXT_WIDTH) for k in range(DEPTH - 1)})
    zeros.update({f"vision_prompts.{k}": torch.zeros(N_CTX, TEACHER_VISION_WIDTH) for k in range(DEPTH)})
    checkpoint = save_checkpoint({"state_dict": zeros, "epoch": cfg.OPTIM.MAX_EPOCH}, folder)
    return folder, cfg, checkpoint


def build_ours(clip, tokenizer, classnames, node, spec):
    """Our PromptKDCLIP with a PromptSRCTeacher read through a TeacherRun of ``_teacher_folder``."""
    from trainers.promptkd import PromptKDCLIP, PromptSRCTeacher, TeacherRun

    folder, cfg, checkpoint = _teacher_folder()
    teacher = PromptSRCTeacher(TeacherRun(folder, cfg, checkpoint, None, ""), classnames, torch.device("cpu"))
    return StudentAndTeacher(PromptKDCLIP(clip, teacher, classnames, node, node.KD_WEIGHT), teacher)


def run_ours(model, node, images, labels):
    """Base logits [B, ⌈C/2⌉], new logits [B, C - ⌈C/2⌉] (eval) and the loss (training mode, all classes).
    The teacher keeps its text features per class list: they are computed again from the prompts the
    harness has just written (a misplaced teacher text prompt must show)."""
    student = model.student
    model.teacher.forget_text_features()
    names, base = list(student.classnames), math.ceil(len(student.classnames) / 2)
    with torch.no_grad():
        student.use_classes(names[:base])
        base_logits = student(images)
        student.use_classes(names[base:])
        new_logits = student(images)
        teacher_logits = model.teacher.logits(images, model.teacher.text_features(names))
    student.use_classes(names)
    student.train()
    loss, _, _ = student.loss(images, labels)
    student.eval()
    return {"base_logits": base_logits, "new_logits": new_logits, "teacher_logits": teacher_logits,
            "loss": loss.detach()}


def prepare_official(cfg, weights_path):
    """No-op ``.cuda()``; the two weights files where the official loaders look; the base2novel mode."""
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    os.makedirs("clip", exist_ok=True)  # the working folder is the harness's workdir
    os.symlink(weights_path, os.path.join("clip", "ViT-B-16.pt"))
    _write_teacher_weights(os.path.join("clip", "ViT-L-14.pt"))
    cfg.TRAINER.NAME, cfg.TRAINER.MODAL = "PromptKD", "base2novel"


def build_official(module, cfg, classnames, clip_model):
    """The official student CustomCLIP and teacher CustomCLIP_teacher (both fp32) under "student." / "teacher."."""
    student = module.CustomCLIP(cfg, classnames, clip_model).float()
    teacher_clip = module.load_clip_to_cpu_teacher(cfg).float()
    teacher = module.CustomCLIP_teacher(cfg, classnames, teacher_clip).float()
    return nn.ModuleDict({"student": student, "teacher": teacher}).eval()


class _Captured:
    """Stands in for the official trainer's evaluator: keeps the logits ``test`` computes."""

    def reset(self):
        self.outputs = []

    def process(self, output, label):
        self.outputs.append(output.detach().clone())

    def evaluate(self):
        return {"accuracy": 0.0}


def run_official(module, cfg, request, model, images, labels):
    """The official PromptKD trainer's ``test`` (split val, then test) and ``forward_backward`` on
    the batch, run on a trainer object holding only what those methods read (no data manager)."""
    student, teacher = model["student"], model["teacher"]
    trainer = object.__new__(module.PromptKD)
    batch = [{"img": images, "label": labels}]
    trainer.__dict__.update(
        model=student, model_teacher=teacher, n_cls=len(request["classnames"]), train_modal="base2novel", cfg=cfg,
        temperature=cfg.TRAINER.PROMPTKD.TEMPERATURE, device=torch.device("cpu"), scaler=None, batch_idx=0,
        num_batches=2, epoch=0, evaluator=_Captured(), _models={"VLPromptLearner": student}, val_loader=batch,
        test_loader=batch, optim=torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.0))
    trainer.write_scalar = lambda *args, **kwargs: None
    outputs = {}
    for split, name in (("val", "base_logits"), ("test", "new_logits")):
        trainer.test(split=split)
        outputs[name] = trainer.evaluator.outputs[0]
    for name, param in student.named_parameters():
        param.requires_grad_("VPT" in name)  # the official build_model's rule
    with torch.no_grad():
        outputs["teacher_logits"] = teacher(images)[2]
    student.train()
    outputs["loss"] = torch.as_tensor(trainer.forward_backward(batch[0])["loss"])
    return outputs


# --------------------------------------------------------------------------- tools/benchmark.py official
# The official step runs the teacher (its text features of every class, then its image tower) and
# the student, whose projector upstream fixes at 512 -> 768: the teacher must have ViT-L/14's
# embedding width, so both sides' teacher is a random ViT-L/14 (seed TEACHER_SEED, one file in the
# working folder) with PromptSRC's 4+4 tokens in 9 layers, as upstream's recipe.
BENCHMARK_TEACHER = "teacher-ViT-L-14.pt"  # in the benchmark's working folder


def _benchmark_teacher_weights(workdir):
    path = os.path.join(workdir, BENCHMARK_TEACHER)
    if not os.path.isfile(path):
        write_weights("ViT-L/14", TEACHER_SEED, path)
    return path


def our_prepare(workdir, image_size):
    """Our case's teacher: a PromptSRC run folder (untrained prompts) on the random ViT-L/14."""
    from trainers.promptkd import write_stand_in_teacher

    folder = write_stand_in_teacher(os.path.join(workdir, "promptkd_teacher_vit_l14"), "ViT-L/14",
                                    _benchmark_teacher_weights(workdir), (image_size, image_size), "OxfordPets")
    return ["TRAINER.PROMPTKD.TEACHER_DIR", folder]


def official_before_build(module, cfg):
    """For the official trainer's build_model: ./clip/ViT-L-14.pt is the random ViT-L/14; the
    teacher checkpoint it reads (``teacher_model/<DATASET.NAME>/VLPromptLearner/model-best.pth.tar``)
    holds no state, so the teacher keeps its initial prompts (their values do not change the step's
    cost); its CLIP is cast to fp32 as the student's (upstream leaves the teacher fp16; cast before
    its TextEncoder is built)."""
    teacher = os.path.join("clip", "ViT-L-14.pt")
    os.remove(teacher)  # prepare_official's small stand-in
    os.symlink(os.path.abspath(_benchmark_teacher_weights(os.getcwd())), teacher)
    path = os.path.join("teacher_model", str(cfg.DATASET.NAME), "VLPromptLearner", BEST_CHECKPOINT)  # Dassl's layout
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_write(path) as f:
        torch.save({"state_dict": {}}, f)
    load_teacher = module.load_clip_to_cpu_teacher
    module.load_clip_to_cpu_teacher = lambda cfg: load_teacher(cfg).float()


OUTPUTS = ("base_logits", "new_logits", "teacher_logits", "loss")
SPECS = (
    MethodSpec(
        name="PromptKD",
        repository="zhengli97/PromptKD",
        dassl_dir="Dassl.pytorch",
        official_module="trainers.promptkd",
        official_cfg={"TRAINER.PROMPTKD": dict(OFFICIAL_NODE)},
        our_node=dict(NODE),
        learnables=learnables(),
        official_learnable=official_learnable,
        outputs=OUTPUTS,
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        build_official=build_official,
        run_official=run_official,
        mutations=(
            Mutation("student prompts of layers 2 and 3 swapped",
                     values=swap("student.vision_prompts.1", "student.vision_prompts.2"), fails=OUTPUTS,
                     any_fails=True),
            Mutation("projector layers' biases swapped",
                     values=swap("student.projector.0.bias", "student.projector.3.bias"), fails=OUTPUTS,
                     any_fails=True),
            Mutation("teacher text prompts of layers 2 and 3 swapped",
                     values=swap("teacher.model.text_prompts.0", "teacher.model.text_prompts.1"), fails=OUTPUTS,
                     any_fails=True),
            # Four prompt tokens among 197 move the random teacher's class token little: swapping its vision
            # prompts of layers 1 and 2 changes its logits by about 3e-4, below the contract's 3e-3 but 100x
            # above the agreement with the official code (about 6e-7).
            Mutation("teacher vision prompts of layers 1 and 2 swapped",
                     values=swap("teacher.model.vision_prompts.0", "teacher.model.vision_prompts.1"),
                     fails=("teacher_logits",), threshold=1e-4),
        ),
        cost=CostSpec(
            trainer="PromptKD",
            # the unprompted CLIP of its IVLP clip package (the frozen unit): upstream's zero-shot design
            plain_design={"trainer": "IVLP", "vision_depth": 0, "language_depth": 0, "vision_ctx": 0,
                          "language_ctx": 0},
            before_build=official_before_build,
            our_prepare=our_prepare,
        ),
    ),
)
