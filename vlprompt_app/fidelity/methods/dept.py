"""DePT on MaPLe and on CoOp against Koorye/DePT's trainers/elp_maple.py and elp_coop.py (run with
``DATASET.SUBSAMPLE_CLASSES`` base so the head exists).

Compared: the similarity logits s·f̂·t̂ᵀ, the head logits h(γ_I ⊙ f + β_I), the fused base-role
logits 0.3·sim + 0.7·head (all [B, C]) and one batch's loss 0.3·CE + 0.7·CE_head over
[text_y; image]; the base method's prompts (MaPLe's prompts and couplings, or CoOp's 16 shared
context vectors), FiLM γ/β of both towers and the head all drawn away from their init.
"""
import torch
import torch.nn.functional as F

from . import coop, maple


def learnables(base_entries):
    """Our parameter name -> official name, shape (symbolic dims), init mean and std: ours is
    DePTCLIP(base model) (the base's entries ``base_entries`` named under ``base.``), the official
    model the base method's prompt learner plus film_lp_img, film_lp_text and linear_probe_proj."""
    entries = dict(base_entries)
    for ours, official in (("film_image", "film_lp_img"), ("film_text", "film_lp_text")):
        entries[f"{ours}.scale"] = {"official": f"{official}.scale", "shape": ("embed",), "init_mean": 1.0,
                                    "init_std": 0.02}
        entries[f"{ours}.shift"] = {"official": f"{official}.bias", "shape": ("embed",), "init_std": 0.02}
    entries["head.weight"] = {"official": "linear_probe_proj.weight", "shape": ("classes", "embed"),
                              "init_std": 512 ** -0.5}
    entries["head.bias"] = {"official": "linear_probe_proj.bias", "shape": ("classes",), "init_std": 0.02}
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    """DePTCLIP on the base model of ``our_dept_node``'s BASE (built from ``node``), fused
    inference, the head over the C classes."""
    from yacs.config import CfgNode as CN

    from trainers.dept import BASES, DePTCLIP

    dept_node = CN(spec["our_dept_node"])
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


def _spec(base, official_module, base_node_key, base_node, base_learnables):
    """The spec of DePT on ``base`` ("MaPLe" or "CoOp"): the official ``official_module`` built with
    the base's node under ``TRAINER.<base_node_key>`` and DePT's upstream defaults."""
    dept_node = {"BASE": base, "PREC": "fp32", "HEAD_WEIGHT": 0.7, "HEAD_LR_MULT": 6.5}
    return {
        "repository": "Koorye/DePT",
        "code_dir": "",
        "official_module": official_module,
        "official_trainer": f"ExtrasLinearProbe{base}",
        "official_train_cfg": dict(maple.DEPT_TRAIN_CFG),
        "dataset": "OxfordPets",
        "official_cfg": {
            f"TRAINER.{base_node_key}": dict(base_node),
            "TRAINER.LINEAR_PROBE": {"TYPE": "linear", "WEIGHT": 0.7, "TEST_TIME_FUSION": True},
            "TRAINER.FILM": {"LINEAR_PROBE": True},
        },
        "our_node": dict(base_node),
        "our_dept_node": dict(dept_node, INFERENCE="fused"),
        "benchmark_case": {"MaPLe": "DePT", "CoOp": "DePT+CoOp"}[base],
        "our_nodes": {f"TRAINER.{base_node_key}": dict(base_node), "TRAINER.DEPT": dept_node},
        "learnables": learnables(base_learnables),
        "official_learnable_prefixes": ("prompt_learner.", "film_lp_img.", "film_lp_text.", "linear_probe_proj."),
        "outputs": ("logits", "head_logits", "fused_logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours,
        # Koorye/DePT's trainers package imports every method (MaPLe's clip_maple, plotnine) either way.
        "prepare_official": maple.prepare_official,
        "run_official": run_official,
    }


SPECS = {
    "DePT-MaPLe": _spec("MaPLe", "trainers.elp_maple", "MAPLE", maple.NODE, maple.learnables("base.")),
    "DePT-CoOp": _spec("CoOp", "trainers.elp_coop", "COOP", coop.NODE,
                       {"base.prompt_learner.ctx": {"official": "prompt_learner.ctx", "init_std": 0.02}}),
}
