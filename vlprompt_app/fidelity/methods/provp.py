"""ProVP-Ref against MCG-NJU/ProVP's ProVP/trainers/provp.py (with its own Dassl fork, ProVP/../Dassl).

Compared, with the prompts P [12, 16, 768] drawn at 10x their init std: the logits [B, C], the
cross-entropy, the re-formation term CE(f̂_p·f̂_CLIPᵀ, arange(B)) (frozen image features from the
official second, fp32 zero-shot ``CLIP``), the training loss CE + 1.0·re-formation of the official
fp32 ``forward_backward`` branch, and the norms [12, 16] of the gradient of that loss with respect
to each prompt token of P (through the in-place re-mix of the official blocks; norms keep the
fixture small). Upstream's ``trainers/__init__.py`` imports a
module the repository does not have (``vpclip``), so the official side imports ``trainers.provp``
from a stand-in ``trainers`` package; its model class is ``mProVP`` (no ``CustomCLIP``).
"""
import importlib
import math
import os
import sys
import types

import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, flip


N_PROMPTS, DEPTH, VISION_WIDTH, PATCH = 16, 12, 768, 14
# U(−v, v) with v = sqrt(6 / (3·14² + 768)) has std v/√3.
INIT_STD = math.sqrt(6.0 / (3 * PATCH * PATCH + VISION_WIDTH)) / math.sqrt(3.0)


def build_ours(clip, tokenizer, classnames, node, spec):
    from vlprompt.methods.prograd_templates import PROGRAD_TEMPLATES
    from trainers.provp import ProVPCLIP

    return ProVPCLIP(clip, tokenizer, classnames, PROGRAD_TEMPLATES[spec.dataset], node)


def run_ours(model, node, images, labels, outputs):
    """Logits [B, C], the loss and its terms ("xe_loss", "ref_loss" unless λ = 0), and the norms of
    ∂loss/∂P per prompt token [12, 16] when ``outputs`` holds "prompt_grad_norms" (the backward through
    the image tower costs twice the forward; without it the forward runs without autograd)."""
    if "prompt_grad_norms" not in outputs:
        with torch.no_grad():
            loss, logits, terms = model.loss(images, labels)
        return dict(terms, logits=logits, loss=loss)
    prompts = model.prompt_learner.prompt_embeddings
    loss, logits, terms = model.loss(images, labels)
    grad, = torch.autograd.grad(loss, prompts)
    return dict(terms, logits=logits.detach(), loss=loss.detach(), prompt_grad_norms=grad.norm(dim=-1))


def prepare_official(cfg, weights_path):
    """Import ProVP/trainers/provp.py through a stand-in ``trainers`` package (upstream's
    ``trainers/__init__.py`` imports the missing ``vpclip``); alias its ``mProVP`` as ``CustomCLIP``."""
    folder = next(os.path.join(entry, "trainers") for entry in sys.path
                  if os.path.isfile(os.path.join(entry, "trainers", "provp.py")))
    package = types.ModuleType("trainers")
    package.__path__ = [folder]
    sys.modules["trainers"] = package
    module = importlib.import_module("trainers.provp")
    module.CustomCLIP = module.mProVP


def run_official(module, cfg, request, model, images, labels):
    """The official fp32 branch of ProVP.forward_backward up to the backward: mProVP's logits and
    features, the zero-shot CLIP's features, ReformatLoss, loss = CE + 1.0·ref; and the norms of
    ∂loss/∂P per prompt token [12, 16]."""
    model.get_text_prompts(images.device)
    zs_clip = module.CLIP(cfg, request["classnames"])
    prompts = model.prompt_learner.prompt_embeddings
    output, p_feat = model(images)
    with torch.no_grad():
        _, clip_feat = zs_clip(images)
    sym_label = torch.arange(clip_feat.shape[0])
    xe_loss, ref_loss = module.ReformatLoss(T=1.0)(output, p_feat, clip_feat, sym_label, labels)
    loss = xe_loss + ref_loss * 1.0  # Lam, hard-coded 1.0 upstream
    grad, = torch.autograd.grad(loss, prompts)
    return {"logits": output.detach(), "xe_loss": xe_loss.detach(), "ref_loss": ref_loss.detach(),
            "loss": loss.detach(), "prompt_grad_norms": grad.norm(dim=-1)}


PROMPTS = "prompt_learner.prompt_embeddings"


def layers_1_and_2_swapped(learnables):
    """The prompts of layers 1 and 2 exchanged."""
    moved = learnables[PROMPTS].clone()
    moved[[1, 2]] = learnables[PROMPTS][[2, 1]]
    return dict(learnables, **{PROMPTS: moved})


SPECS = (
    MethodSpec(
        name="ProVP",
        repository="MCG-NJU/ProVP",
        code_dir="ProVP",
        dassl_dir="Dassl",
        official_module="trainers.provp",
        dataset="OxfordPets",
        official_cfg={"TRAINER.COOP": {"N_CTX": N_PROMPTS, "PREC": "fp32"}},
        our_node={"N_PROMPTS": N_PROMPTS, "PROMPT_DEPTH": DEPTH, "ALPHA": 0.01, "INIT_PATCH_SIZE": PATCH,
                  "REF_WEIGHT": 1.0, "PREC": "fp32"},
        learnables={PROMPTS: Learnable(PROMPTS, INIT_STD, (DEPTH, N_PROMPTS, "vision_width"))},
        outputs=("logits", "xe_loss", "ref_loss", "loss", "prompt_grad_norms"),
        on_demand_outputs=("prompt_grad_norms",),
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        run_official=run_official,
        mutations=(
            Mutation("prompt layers reversed", values=flip(PROMPTS)),
            Mutation("prompts of layers 1 and 2 swapped", values=layers_1_and_2_swapped),
            # α = 0.99 (the weights of x_p and P_l swapped) keeps the previous outputs instead of P_l (a plain
            # replacement, α = 0, differs from α = 0.01 by less than the tolerance: 1 % of the prompt outputs)
            Mutation("re-mix weights swapped", node={"ALPHA": 0.99}),
            Mutation("loss without the re-formation term", node={"REF_WEIGHT": 0.0}, fails=("loss",)),
        ),
        # upstream's train.py: LOSS.T (ReformatLoss's T, unused by it) and OPTIM.USE_REF (its configs: True)
        cost=CostSpec(trainer="ProVP", train_cfg={"LOSS": {"T": 1.0}, "OPTIM.USE_REF": True}),
    ),
)
