"""TCP against htyao89/Textual-based_Class-aware_prompt_tuning's trainers/tcp.py.

Compared: the logits [B, C] and the training loss CE + 8·(1 − mean_c cos(t̂_c, ê_c)) as the
official forward returns it, with the context and the meta-net (Text Knowledge Embedding) drawn
away from their init. Upstream's prompt learner builds a second, fp16 CLIP on CUDA for the
knowledge features ê_c: there ``.cuda()`` is a no-op and those features are cast to fp32 for
the fp32 meta-net (upstream's fp32 branch omits the cast: a dtype error).
"""
import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation
from .common import reversed_rows


def meta_net_learnables(embed_dim=512, width=512, n_ctx=4):
    """The meta-net of ViT-B/16, our name -> {official name, shape, init std}: nn.Linear's init
    U(±1/sqrt(fan_in)), std 1/sqrt(3·fan_in); the names are the same on both sides."""
    hidden = embed_dim // 4
    entries = {}
    for layer, (fan_in, fan_out) in (("linear1", (embed_dim, hidden)), ("linear2", (hidden, n_ctx * width))):
        for kind, shape in (("weight", (fan_out, fan_in)), ("bias", (fan_out,))):
            name = f"prompt_learner.meta_net.{layer}.{kind}"
            entries[name] = Learnable(name, (3 * fan_in) ** -0.5, shape)
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.tcp import TCP_TEMPLATES, TCPCLIP

    return TCPCLIP(clip, tokenizer, classnames, node, *TCP_TEMPLATES[spec.dataset])


def run_ours(model, node, images, labels):
    with torch.no_grad():
        loss, logits, _ = model.loss(images, labels)
    return {"logits": logits, "loss": loss}


def prepare_official(cfg, weights_path):
    """TCP loads CLIP through its own copy of the clip package (trainers/clip_text)."""
    from trainers.clip_text import clip as tcp_clip

    tcp_clip._download = lambda url, root=None: weights_path
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self


def prepare_official_model(model):
    """The knowledge features ê_c come from upstream's fp16 CLIP: cast to fp32 for the fp32 meta-net."""
    model.prompt_learner.text_features = model.prompt_learner.text_features.float()
    model.ori_embedding = model.prompt_learner.text_features


def run_official(module, cfg, request, model, images, labels):
    """TCP's logits [B, C] and training loss, as its forward returns them in training mode."""
    prepare_official_model(model)
    model.prompt_learner.train()
    with torch.no_grad():
        logits, loss = model(images, labels)
    return {"logits": logits, "loss": loss}


SPECS = (
    MethodSpec(
        name="TCP",
        repository="htyao89/Textual-based_Class-aware_prompt_tuning",
        official_module="trainers.tcp",
        dataset="OxfordPets",
        official_cfg={"TRAINER.COOP": {"N_CTX": 4, "CSC": False, "CTX_INIT": False, "W": 1.0,
                                          "CLASS_TOKEN_POSITION": "end", "PREC": "fp32"},
                         "TRAINER.COCOOP": {"N_CTX": 4, "CTX_INIT": False, "PREC": "fp32"}},
        our_node={"N_CTX": 4, "PREC": "fp32", "INJECT_LAYER": 8, "W_TEXT": 8.0},
        learnables=dict({"prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)}, **meta_net_learnables()),
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        run_official=run_official,
        prepare_official_model=prepare_official_model,
        mutations=(Mutation("learnable rows in reverse order", values=reversed_rows),
                   # the class-aware tokens injected one text block off (upstream: block 8)
                   Mutation("injection one block early", node={"INJECT_LAYER": 7}),
                   Mutation("injection one block late", node={"INJECT_LAYER": 9})),
        cost=CostSpec(trainer="TCP"),
    ),
)
