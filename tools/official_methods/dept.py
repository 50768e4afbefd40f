"""DePT on MaPLe against Koorye/DePT's trainers/elp_maple.py (run with ``DATASET.SUBSAMPLE_CLASSES``
base so the head exists).

Compared: the similarity logits s·f̂·t̂ᵀ, the head logits h(γ_I ⊙ f + β_I), the fused base-role
logits 0.3·sim + 0.7·head (all [B, C]) and one batch's loss 0.3·CE + 0.7·CE_head over
[text_y; image]; MaPLe's prompts and couplings, FiLM γ/β of both towers and the head all drawn
away from their init.
"""
import torch
import torch.nn.functional as F

from . import maple


def learnables():
    """Our parameter name -> official name, shape (symbolic dims), init mean and std: ours is
    DePTCLIP(MaPLeCLIP) (the base under ``base.``), the official model MaPLe's prompt learner plus
    film_lp_img, film_lp_text and linear_probe_proj."""
    entries = maple.learnables("base.")
    for ours, official in (("film_image", "film_lp_img"), ("film_text", "film_lp_text")):
        entries[f"{ours}.scale"] = {"official": f"{official}.scale", "shape": ("embed",), "init_mean": 1.0,
                                    "init_std": 0.02}
        entries[f"{ours}.shift"] = {"official": f"{official}.bias", "shape": ("embed",), "init_std": 0.02}
    entries["head.weight"] = {"official": "linear_probe_proj.weight", "shape": ("classes", "embed"),
                              "init_std": 512 ** -0.5}
    entries["head.bias"] = {"official": "linear_probe_proj.bias", "shape": ("classes",), "init_std": 0.02}
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    """DePTCLIP on MaPLeCLIP, fused inference, the head over the C classes."""
    from yacs.config import CfgNode as CN

    from trainers.dept import DePTCLIP
    from trainers.maple import MaPLeCLIP

    base = MaPLeCLIP(clip, tokenizer, classnames, node)
    dept_node = CN(spec["our_dept_node"])
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


SPECS = {
    "DePT-MaPLe": {
        "repository": "Koorye/DePT",
        "code_dir": "",
        "official_module": "trainers.elp_maple",
        "dataset": "OxfordPets",
        "official_cfg": {
            "TRAINER.MAPLE": dict(maple.NODE),
            "TRAINER.LINEAR_PROBE": {"TYPE": "linear", "WEIGHT": 0.7, "TEST_TIME_FUSION": True},
            "TRAINER.FILM": {"LINEAR_PROBE": True},
        },
        "our_node": dict(maple.NODE),
        "our_dept_node": {"BASE": "MaPLe", "PREC": "fp32", "HEAD_WEIGHT": 0.7, "HEAD_LR_MULT": 6.5,
                          "INFERENCE": "fused"},
        "learnables": learnables(),
        "official_learnable_prefixes": ("prompt_learner.", "film_lp_img.", "film_lp_text.", "linear_probe_proj."),
        "outputs": ("logits", "head_logits", "fused_logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours,
        "prepare_official": maple.prepare_official,
        "run_official": run_official,
    },
}
