"""MaPLe against Koorye/DePT's trainers/maple.py (the MaPLe code DePT builds on; it loads CLIP
through its own ``clip_maple`` package): logits [B, C] and CE, with the prompts T_1..T_J and the
couplings F_1..F_J drawn away from their init."""
import sys
import types

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, flip, swap
from .common import run_official_logits_and_ce, run_ours_logits_and_ce

DEPTH = 9  # MaPLe's PROMPT_DEPTH: T_1 plus 8 deep text prompts and 8 couplings
NODE = {"N_CTX": 2, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH": DEPTH}
_COUPLING_STD = 512 ** -0.5
_COUPLING_SHAPES = {"weight": ("vision_width", "width"), "bias": ("vision_width",)}
# What Koorye/DePT's train.py (extend_cfg) adds to the Dassl config and its trainers' build_model
# reads: its build_optimizer's staged learning rates (the head and FiLM at LR x LR_EXP) and the
# names of the parameters to train.
DEPT_TRAIN_CFG = {"OPTIM.LR_EXP": 6.5, "OPTIM.STAGED_LR": True, "OPTIM.NEW_LAYERS": ["linear_probe", "film"],
                  "OPTIM.BASE_LR_MULT": 1.0, "TRAINER.NAMES_TO_UPDATE": ["prompt_learner", "linear_probe", "film"]}


def learnables(prefix, depth=DEPTH):
    """MaPLe's learnable values: our parameter name (under ``prefix``) -> official name, shape
    (symbolic dims), init std: T_1, the couplings F_1..F_J and the deep text prompts T_2..T_J (J = ``depth``)."""
    entries = {f"{prefix}prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)}
    couplings = [("proj", "proj")] + [(f"compound_prompt_projections.{i}",) * 2 for i in range(depth - 1)]
    for ours, official in couplings:
        for kind, shape in _COUPLING_SHAPES.items():
            entries[f"{prefix}prompt_learner.{ours}.{kind}"] = Learnable(
                f"prompt_learner.{official}.{kind}", _COUPLING_STD, shape)
    for i in range(depth - 1):
        entries[f"{prefix}prompt_learner.compound_prompts_text.{i}"] = Learnable(
            f"prompt_learner.compound_prompts_text.{i}", 0.02)
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    from vlprompt.methods.coupled_prompts import MaPLeCLIP

    return MaPLeCLIP(clip, tokenizer, classnames, node)


def prepare_official(cfg, weights_path):
    """Koorye/DePT's MaPLe loads CLIP through ``clip_maple``; DePT's head needs the base split."""
    from clip_maple import clip as official_clip_maple

    official_clip_maple._download = lambda url, root=None: weights_path
    cfg.DATASET.SUBSAMPLE_CLASSES = "base"  # the head exists (and the forward fuses) for base classes
    sys.modules["plotnine"] = types.ModuleType("plotnine")  # imported (*) by elp_*.py, unused here


def misplacements(prefix=""):
    """MaPLe's prompts or couplings put in the wrong place (our names under ``prefix``)."""
    def name(suffix):
        return f"{prefix}prompt_learner.{suffix}"

    return (Mutation("ctx tokens reversed", values=flip(name("ctx"))),
            Mutation("deep prompts of layers 2 and 3 swapped",
                     values=swap(name("compound_prompts_text.0"), name("compound_prompts_text.1"))),
            Mutation("couplings F_2 and F_3 swapped", values=swap(
                [name(f"compound_prompt_projections.0.{kind}") for kind in ("weight", "bias")],
                [name(f"compound_prompt_projections.1.{kind}") for kind in ("weight", "bias")])))


SPECS = (
    MethodSpec(
        name="MaPLe",
        repository="Koorye/DePT",
        official_module="trainers.maple",
        official_cfg={"TRAINER.MAPLE": dict(NODE)},
        our_node=dict(NODE),
        learnables=learnables(""),
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours_logits_and_ce,
        prepare_official=prepare_official,
        run_official=run_official_logits_and_ce,
        mutations=misplacements(),
        cost=CostSpec(trainer="MaPLe", train_cfg=dict(DEPT_TRAIN_CFG), gpu_acceptance=True),
    ),
)
