"""DePT on MaPLe and on CoOp against Koorye/DePT's trainers/elp_maple.py and elp_coop.py (run with
``DATASET.SUBSAMPLE_CLASSES`` base so the head exists).

Compared: the similarity logits s·f̂·t̂ᵀ, the head logits h(γ_I ⊙ f + β_I), the fused base-scope
logits 0.3·sim + 0.7·head (all [B, C]) and one batch's loss 0.3·CE + 0.7·CE_head over
[text_y; image]; the base method's prompts (MaPLe's prompts and couplings, or CoOp's 16 shared
context vectors), FiLM γ/β of both towers and the head all drawn away from their init.
"""
import torch
import torch.nn.functional as F

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, flip
from . import coop, maple


def learnables(base_entries):
    """Our parameter name -> official name, shape (symbolic dims), init mean and std: ours is
    DePTCLIP(base model) (the base's entries ``base_entries`` named under ``base.``), the official
    model the base method's prompt learner plus film_lp_img, film_lp_text and linear_probe_proj."""
    entries = dict(base_entries)
    for ours, official in (("film_image", "film_lp_img"), ("film_text", "film_lp_text")):
        entries[f"{ours}.scale"] = Learnable(f"{official}.scale", 0.02, ("embed",), init_mean=1.0)
        entries[f"{ours}.shift"] = Learnable(f"{official}.bias", 0.02, ("embed",))
    entries["head.weight"] = Learnable("linear_probe_proj.weight", 512 ** -0.5, ("classes", "embed"))
    entries["head.bias"] = Learnable("linear_probe_proj.bias", 0.02, ("classes",))
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    """DePTCLIP on the base model of the DePT node's BASE (``spec.options["dept_node"]``; the base
    built from ``node``), fused inference, the head over the C classes."""
    from yacs.config import CfgNode as CN

    from trainers.dept import BASES, DePTCLIP

    dept_node = CN(spec.options["dept_node"])
    base = BASES[dept_node.BASE][1](clip, tokenizer, classnames, node)
    return DePTCLIP(base, dept_node, dept_node.INFERENCE, len(classnames))


def run_ours(model, node, images, labels):
    with torch.no_grad():
        features = model.base.unnormalised_image_features(images)
        logits = model.similarity_logits(features, F.normalize(model.base.compute_text_features(), dim=-1))
        head_logits = model.head_logits(features)
        fused_logits = model(images)
        loss, _, _ = model.loss(images, labels)
    return {"logits": logits, "head_logits": head_logits, "fused_logits": fused_logits, "loss": loss}


def run_official(module, cfg, request, model, images, labels):
    """The official CustomCLIP's similarity, head and fused logits (eval) and its training loss
    (train mode: ``forward(img, labels)`` returns the loss)."""
    with torch.no_grad():
        text_feats, img_feats = model._forward_feats(images)
        logits = model._forward_logits_similarity(text_feats, img_feats)
        head_logits, _ = model._forward_logits_linear_probe(text_feats, img_feats, None)
        fused_logits = model(images)
        model.train()
        loss = model(images, labels)
        model.eval()
    return {"logits": logits, "head_logits": head_logits, "fused_logits": fused_logits, "loss": loss}


def film_of_the_other_tower(learnables):
    """γ/β of the image tower put on the text tower and vice versa: the head sees other features."""
    moved = dict(learnables)
    for kind in ("scale", "shift"):
        moved[f"film_image.{kind}"], moved[f"film_text.{kind}"] = learnables[f"film_text.{kind}"], \
            learnables[f"film_image.{kind}"]
    return moved


MUTATIONS = (
    Mutation("base ctx tokens reversed", values=flip("base.prompt_learner.ctx")),
    Mutation("FiLM of the wrong tower", values=film_of_the_other_tower, fails=("head_logits", "loss")),
)


def _spec(name, base, official_module, base_node_key, base_node, base_learnables):
    """The spec of DePT on ``base`` ("MaPLe" or "CoOp"): the official ``official_module`` built with
    the base's node under ``TRAINER.<base_node_key>`` and DePT's upstream defaults."""
    dept_node = {"BASE": base, "PREC": "fp32", "HEAD_WEIGHT": 0.7, "HEAD_LR_MULT": 6.5}
    return MethodSpec(
        name=name,
        repository="Koorye/DePT",
        official_module=official_module,
        dataset="OxfordPets",
        official_cfg={
            f"TRAINER.{base_node_key}": dict(base_node),
            "TRAINER.LINEAR_PROBE": {"TYPE": "linear", "WEIGHT": 0.7, "TEST_TIME_FUSION": True},
            "TRAINER.FILM": {"LINEAR_PROBE": True},
        },
        our_node=dict(base_node),
        options={"dept_node": dict(dept_node, INFERENCE="fused")},
        learnables=learnables(base_learnables),
        official_learnable_prefixes=("prompt_learner.", "film_lp_img.", "film_lp_text.", "linear_probe_proj."),
        outputs=("logits", "head_logits", "fused_logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours,
        # Koorye/DePT's trainers package imports every method (MaPLe's clip_maple, plotnine) either way.
        prepare_official=maple.prepare_official,
        run_official=run_official,
        mutations=MUTATIONS,
        cost=CostSpec(trainer=f"ExtrasLinearProbe{base}", train_cfg=dict(maple.DEPT_TRAIN_CFG),
                      case={"MaPLe": "DePT", "CoOp": "DePT+CoOp"}[base],
                      our_nodes={f"TRAINER.{base_node_key}": dict(base_node), "TRAINER.DEPT": dept_node}),
    )


SPECS = (
    _spec("DePT-MaPLe", "MaPLe", "trainers.elp_maple", "MAPLE", maple.NODE, maple.learnables("base.")),
    _spec("DePT-CoOp", "CoOp", "trainers.elp_coop", "COOP", coop.NODE,
          {"base.prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)}),
)
