"""ProGrad against BeierZhu/Prompt-align's ProGrad.public (with its own Dassl fork).

Compared: the student's and the zero-shot teacher's logits [B, C], CE, KL, and the ctx update
of one official ``prograd_backward_and_update`` step under SGD at lr 1 (the projected
gradient [n, D]). The batch's labels go against the teacher's preference, so the CE and KL
gradients conflict and the projection acts.
"""
import torch
import torch.nn.functional as F

from ..spec import CostSpec, Learnable, MethodSpec, Mutation
from .common import reversed_rows


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.prograd import ProGradCLIP, template_for

    return ProGradCLIP(clip, tokenizer, classnames, node, template_for(spec.dataset, ""))


def run_ours(model, node, images, labels):
    """Also "ctx_grad_ce", the CE gradient before the projection (not compared: it shows the projection acts)."""
    from trainers.prograd import project_conflicting

    loss_ce, loss_kl, logits = model.losses(images, labels)
    with torch.no_grad():
        image_features = F.normalize(model.clip.encode_image(images), dim=-1)
        zs_logits = model.cosine_logits(image_features, model.zs_text_features)
    ctx = dict(model.named_parameters())["prompt_learner.ctx"]
    grad_kl, = torch.autograd.grad(loss_kl, ctx, retain_graph=True)
    grad_ce, = torch.autograd.grad(loss_ce, ctx)
    update = project_conflicting(grad_ce, grad_kl, node.LAMBDA)
    return {"logits": logits.detach(), "loss": loss_ce.detach(), "zs_logits": zs_logits,
            "kl_loss": loss_kl.detach(), "ctx_update": update, "ctx_grad_ce": grad_ce}


def run_official(module, cfg, request, model, images, labels):
    """ProGrad's forward_backward (fp32 branch) on one batch, with its Dassl TrainerBase's
    prograd_backward_and_update and SGD at lr 1, so the ctx update is the projected gradient."""
    from dassl.engine.trainer import TrainerBase

    zs_clip = module.CLIP(cfg, request["classnames"])
    logits = model(images)
    with torch.no_grad():
        zs_logits = zs_clip(images)
    loss_ce, loss_kl = module.ProGradLoss(T=cfg.LOSS.T)(logits, zs_logits.detach(), labels)
    for name, param in model.named_parameters():
        param.requires_grad_("prompt_learner" in name)
    trainer = TrainerBase()  # holds prograd_backward_and_update and the model registry
    trainer.register_model("prompt_learner", model.prompt_learner,
                           torch.optim.SGD(model.prompt_learner.parameters(), lr=1.0), None)
    before = model.prompt_learner.ctx.detach().clone()
    trainer.prograd_backward_and_update(loss_ce, loss_kl, cfg.LOSS.LAMBDA)
    return {"logits": logits.detach(), "loss": loss_ce.detach(), "zs_logits": zs_logits, "kl_loss": loss_kl.detach(),
            "ctx_update": before - model.prompt_learner.ctx.detach()}


SPECS = (
    MethodSpec(
        name="ProGrad",
        repository="BeierZhu/Prompt-align",
        code_dir="ProGrad.public",
        dassl_dir="Dassl.ProGrad.pytorch",
        official_module="trainers.prograd",
        dataset="OxfordPets",
        official_cfg={
            "TRAINER.COOP": {"N_CTX": 16, "CSC": False, "CTX_INIT": True, "CLASS_TOKEN_POSITION": "end",
                             "PREC": "fp32", "ALPHA": 1.0},
            "LOSS": {"NAME": "prograd", "T": 1.0, "LAMBDA": 1.0},
        },
        our_node={"N_CTX": 16, "CSC": False, "CTX_INIT": True, "CLASS_TOKEN_POSITION": "end", "PREC": "fp32",
                     "LAMBDA": 1.0, "T": 1.0},
        labels=(0, 0),
        learnables={"prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)},
        outputs=("logits", "loss", "zs_logits", "kl_loss", "ctx_update"),
        build_ours=build_ours,
        run_ours=run_ours,
        run_official=run_official,
        mutations=(Mutation("learnable rows in reverse order", values=reversed_rows),),
        cost=CostSpec(trainer="ProGrad"),
    ),
)
