"""ATPrompt against zhengli97/ATPrompt's trainers/coop_atp.py (on CoOp) and trainers/maple_atp.py
(on MaPLe, with its clip/model_atp.py): logits [B, C] and CE, the attributes "color" and "shape"
(upstream's ImageNet words) with 2 soft tokens each, every learnable value (context, attribute
tokens, and on MaPLe the deep prompts and couplings) drawn away from its init.

Upstream always builds three attribute tensors (ctx_att1..3); with two attributes the third is
never read: it is filled with NaN on the official side, so reading it would show in the logits.
"""
import torch

from . import maple
from .common import logits_and_ce, run_ours_logits_and_ce

WORDS = ["color", "shape"]
N_ATT = 2
# The official node: ATPROMPT as upstream's scripts set it for ImageNet (N_ATT1..3 = N_CTX = 2).
OFFICIAL_ATPROMPT = {"USE_ATPROMPT": True, "ATT_NUM": len(WORDS), "ATT1_TEXT": WORDS[0], "ATT2_TEXT": WORDS[1],
                     "ATT3_TEXT": "none", "N_ATT1": N_ATT, "N_ATT2": N_ATT, "N_ATT3": N_ATT}
COOP_NODE = {"N_CTX": 2, "CSC": False, "CTX_INIT": "", "CLASS_TOKEN_POSITION": "end", "PREC": "fp32"}
# Upstream's MaPLe ATP ignores CTX_INIT (random context behind "X X" placeholders).
MAPLE_NODE = dict(maple.NODE, CTX_INIT="")
UNUSED = "prompt_learner.ctx_att3"


def attribute_learnables():
    """The attribute tokens A_1, A_2: our name -> official name, shape, init std."""
    return {f"attributes.soft.{k}": {"official": f"prompt_learner.ctx_att{k + 1}", "shape": (N_ATT, "width"),
                                     "init_std": 0.01} for k in range(len(WORDS))}


def build_ours(clip, tokenizer, classnames, node, spec):
    """ATPromptCLIP on the spec's base method; ``node`` is the base method's node plus WORDS and N_ATT."""
    from trainers.atprompt import ATPromptCLIP, AttributeTokens
    from trainers.coop import CoOpCLIP
    from trainers.maple import MaPLeCLIP

    base_model = {"CoOp": CoOpCLIP, "MaPLe": MaPLeCLIP}[spec["base"]]
    base = base_model(clip, tokenizer, classnames, node)
    return ATPromptCLIP(base, AttributeTokens(clip.text, tokenizer, list(node.WORDS), node.N_ATT))


def run_official(module, cfg, request, model, images, labels):
    """Logits and CE of the official CustomCLIP, its unused third attribute tensor set to NaN."""
    with torch.no_grad():
        dict(model.named_parameters())[UNUSED].fill_(float("nan"))
    return logits_and_ce(model, images, labels)


def _spec(base, module, base_key, node, learnables, official_trainer, benchmark_case):
    return {
        "repository": "zhengli97/ATPrompt",
        "code_dir": "",
        "dassl_dir": "Dassl.pytorch",
        "official_module": module,
        "dataset": "ImageNet",
        "base": base,
        "official_cfg": {f"TRAINER.{base_key}": dict(node), "TRAINER.ATPROMPT": dict(OFFICIAL_ATPROMPT)},
        "our_node": dict(node, WORDS=list(WORDS), N_ATT=N_ATT),
        "learnables": dict(learnables, **attribute_learnables()),
        "official_unused": (UNUSED,),
        "outputs": ("logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours_logits_and_ce,
        "run_official": run_official,
        "official_trainer": official_trainer,
        "benchmark_case": benchmark_case,
        "our_nodes": {f"TRAINER.{base_key}": dict(node), "TRAINER.ATPROMPT": {"N_ATT": N_ATT, "PREC": "fp32"}},
    }


SPECS = {
    "ATPrompt": _spec("CoOp", "trainers.coop_atp", "COOP", COOP_NODE, {
        "base.prompt_learner.ctx": {"official": "prompt_learner.ctx", "shape": (COOP_NODE["N_CTX"], "width"),
                                    "init_std": 0.02}}, "CoOp_ATP", "ATPrompt"),
    "ATPrompt-MaPLe": _spec("MaPLe", "trainers.maple_atp", "MAPLE", MAPLE_NODE, maple.learnables("base."),
                            "MaPLe_ATP", "ATPrompt+MaPLe"),
}