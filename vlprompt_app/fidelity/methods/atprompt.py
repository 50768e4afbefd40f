"""ATPrompt against zhengli97/ATPrompt's trainers/coop_atp.py (on CoOp) and trainers/maple_atp.py
(on MaPLe, with its clip/model_atp.py): logits [B, C] and CE, the attributes "color" and "shape"
(upstream's ImageNet words) with 2 soft tokens each, every learnable value (context, attribute
tokens, and on MaPLe the deep prompts and couplings) drawn away from its init.

Upstream always builds three attribute tensors (ctx_att1..3); with two attributes the third is
never read: it is filled with NaN on the official side, so reading it would show in the logits.
"""
import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, swap
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
    return {f"attributes.soft.{k}": Learnable(f"prompt_learner.ctx_att{k + 1}", 0.01, (N_ATT, "width"))
            for k in range(len(WORDS))}


def build_ours(clip, tokenizer, classnames, node, spec):
    """ATPromptCLIP on the spec's base method; ``node`` is the base method's node plus WORDS and N_ATT."""
    from trainers.atprompt import ATPromptCLIP, AttributeTokens
    from vlprompt.methods.coupled_prompts import MaPLeCLIP
    from vlprompt.methods.text_context import CoOpCLIP

    base_model = {"CoOp": CoOpCLIP, "MaPLe": MaPLeCLIP}[spec.options["base"]]
    base = base_model(clip, tokenizer, classnames, node)
    return ATPromptCLIP(base, AttributeTokens(clip.text, tokenizer, list(node.WORDS), node.N_ATT))


def run_official(module, cfg, request, model, images, labels):
    """Logits and CE of the official CustomCLIP, its unused third attribute tensor set to NaN."""
    with torch.no_grad():
        dict(model.named_parameters())[UNUSED].fill_(float("nan"))
    return logits_and_ce(model, images, labels)


def one_soft_token_per_attribute(learnables):
    """A_1 = its first token only, A_2 = the rest (with N_ATT 1): every later position moves by one."""
    first = learnables["attributes.soft.0"]
    return dict(learnables, **{"attributes.soft.0": first[:1], "attributes.soft.1": first[1:]})


MUTATIONS = (
    Mutation("attribute tokens swapped", values=swap("attributes.soft.0", "attributes.soft.1")),
    Mutation("attribute words swapped", node={"WORDS": ["shape", "color"]}),
    Mutation("one soft token per attribute position", values=one_soft_token_per_attribute, node={"N_ATT": 1}),
)


def _spec(name, base, module, base_key, node, learnables, official_trainer, benchmark_case):
    return MethodSpec(
        name=name,
        repository="zhengli97/ATPrompt",
        dassl_dir="Dassl.pytorch",
        official_module=module,
        dataset="ImageNet",
        options={"base": base},
        official_cfg={f"TRAINER.{base_key}": dict(node), "TRAINER.ATPROMPT": dict(OFFICIAL_ATPROMPT)},
        our_node=dict(node, WORDS=list(WORDS), N_ATT=N_ATT),
        learnables=dict(learnables, **attribute_learnables()),
        official_unused=(UNUSED,),
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours_logits_and_ce,
        run_official=run_official,
        mutations=MUTATIONS,
        cost=CostSpec(trainer=official_trainer, case=benchmark_case, our_nodes={
            f"TRAINER.{base_key}": dict(node), "TRAINER.ATPROMPT": {"N_ATT": N_ATT, "PREC": "fp32"}}),
    )


SPECS = (
    _spec("ATPrompt", "CoOp", "trainers.coop_atp", "COOP", COOP_NODE, {
        "base.prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02, (COOP_NODE["N_CTX"], "width"))},
        "CoOp_ATP", "ATPrompt"),
    _spec("ATPrompt-MaPLe", "MaPLe", "trainers.maple_atp", "MAPLE", MAPLE_NODE, maple.learnables("base."),
          "MaPLe_ATP", "ATPrompt+MaPLe"),
)
