"""MMRL and MMRL++ against yunncheng/MMRL's trainers/mmrl.py and trainers/mmrlpp.py (their own clip
copies clip/model_mmrl.py, clip/model_mmrlpp.py).

Compared (base role, OxfordPets' template): the fused logits α·z_c + (1−α)·z_r ("logits"), the
class-token logits z_c, the representation logits z_r (all [B, C]) and one batch's training loss
α·CE(z_c) + (1−α)·CE(z_r) + λ·(1 − cos(f_cls, f_cls^CLIP)) + λ·(1 − cos(t, t^CLIP)), the references
from a second, frozen CLIP as upstream's trainer builds it. Every learnable value is drawn away
from its init: R, each of the 7 per-layer maps of both towers on its own (upstream's copies start
equal) and proj_rep (MMRL); R, the shared weights, every layer's bias, A and B (B zero at init)
and the projection residual A_p, B_p (MMRL++).

Stand-ins on the official side (the official model classes are unchanged):
* the harness loads upstream's plain CLIP (``load_clip_to_cpu(cfg)``); ``build_official`` loads
  the method's model (``load_clip_to_cpu(cfg, "MMRL")`` / ``"MMRLpp"``) for ``CustomCLIP``, as the
  trainer's ``build_model`` does;
* its frozen-CLIP text references (``_get_text_base_features_zero_shot``) move the text encoder
  and the token ids to CUDA: ``.cuda()`` of modules and tensors is a no-op there;
* the frozen image references come from the zero-shot CLIP's ``visual`` as in the trainer's
  ``forward_backward`` (its fp32 branch), normalised as there.
"""
import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, swap

ALPHA, REG_WEIGHT, K, REP_DIM, LAYERS = 0.7, 0.5, 5, 512, [6, 7, 8, 9, 10, 11, 12]
VISION_WIDTH, TEXT_WIDTH, EMBED = 768, 512, 512
LINEAR_STD = (3 * REP_DIM) ** -0.5  # nn.Linear(d_r, D): U(±1/sqrt(d_r))
NODE = {"N_REP_TOKENS": K, "REP_LAYERS": LAYERS, "REP_DIM": REP_DIM, "REG_WEIGHT": REG_WEIGHT, "ALPHA": ALPHA,
        "PREC": "fp32"}
OUTPUTS = ("logits", "cls_logits", "rep_logits", "loss")


def mmrl_learnables():
    """MMRL's learnables of ViT-B/16, our name -> {official name, shape, init std}."""
    entries = {"representation.rep": Learnable("representation_learner.compound_rep_tokens", 0.02, (K, REP_DIM)),
               "representation.proj_rep": Learnable("image_encoder.proj_rep", VISION_WIDTH ** -0.5,
                                                    (VISION_WIDTH, EMBED))}
    for ours, official, width in (("visual", "r2vproj", VISION_WIDTH), ("text", "r2tproj", TEXT_WIDTH)):
        for layer in range(len(LAYERS)):
            for kind, shape in (("weight", (width, REP_DIM)), ("bias", (width,))):
                entries[f"representation.{ours}.{layer}.{kind}"] = Learnable(
                    f"representation_learner.compound_rep_tokens_{official}.{layer}.{kind}", LINEAR_STD, shape)
    return entries


def mmrlpp_learnables(rank=4, proj_rank=64):
    """MMRL++'s learnables of ViT-B/16, our name -> {official name, shape, init std}: A Kaiming-uniform
    (a = √5) U(±1/sqrt(r)), std 1/sqrt(3r); B, zero at init, gets std 0.02."""
    entries = {"representation.rep": Learnable("representation_learner.compound_rep_tokens", 0.02, (K, REP_DIM)),
               "representation.proj_residual.a": Learnable("image_encoder.A", (3 * proj_rank) ** -0.5,
                                                           (VISION_WIDTH, proj_rank)),
               "representation.proj_residual.b": Learnable("image_encoder.B", 0.02, (proj_rank, EMBED))}
    for ours, official, width in (("visual", "srra_r2vproj", VISION_WIDTH), ("text", "srra_r2tproj", TEXT_WIDTH)):
        prefix = f"representation_learner.{official}"
        entries[f"representation.{ours}.weight"] = Learnable(f"{prefix}.weight", LINEAR_STD, (width, REP_DIM))
        for layer in range(len(LAYERS)):
            for kind, official_kind, shape, std in (("bias", "bias", (width,), LINEAR_STD),
                                                    ("residuals.{}.a", "A", (width, rank), (3 * rank) ** -0.5),
                                                    ("residuals.{}.b", "B", (rank, REP_DIM), 0.02)):
                name = f"bias.{layer}" if kind == "bias" else kind.format(layer)
                entries[f"representation.{ours}.{name}"] = Learnable(f"{prefix}.srra.{layer}.{official_kind}", std,
                                                                     shape)
    return entries


def build_mmrl(clip, tokenizer, classnames, node, spec):
    from vlprompt.methods.representation_tokens import MMRLCLIP

    return MMRLCLIP(clip, tokenizer, classnames, spec.options["template"], node, node.REP_DIM, node.REG_WEIGHT,
                    "fusion")


def build_mmrlpp(clip, tokenizer, classnames, node, spec):
    from trainers.mmrlpp import MMRLppCLIP

    return MMRLppCLIP(clip, tokenizer, classnames, spec.options["template"], node, node.REP_DIM, node.REG_WEIGHT,
                      "fusion")


def run_ours(model, node, images, labels):
    """The base-scope outputs and the training loss of our MMRLCLIP / MMRLppCLIP."""
    with torch.no_grad():
        f_cls, f_rep, _ = model.encode_image(images)
        z_c, z_r = model.logits(f_cls, f_rep, model.class_text_features())
        loss, _, _ = model.loss(images, labels)
        fused = model(images)
    return {"logits": fused, "cls_logits": z_c, "rep_logits": z_r, "loss": loss}


def prepare_official(cfg, weights_path):
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self


def _build_official(model_name):
    def build_official(module, cfg, classnames, clip_model):
        method_clip = module.load_clip_to_cpu(cfg, model_name).float()
        return module.CustomCLIP(cfg, classnames, method_clip).float().eval()
    return build_official


def _run_official(node_name, loss_class):
    def run_official(module, cfg, request, model, images, labels):
        node = getattr(cfg.TRAINER, node_name)
        zero_shot = module.load_clip_to_cpu(cfg, "CLIP").float().eval()
        with torch.no_grad():
            text_clip = module._get_text_base_features_zero_shot(cfg, request["classnames"], zero_shot,
                                                                 module.TextEncoder_CLIP(zero_shot))
            text_clip = text_clip / text_clip.norm(dim=-1, keepdim=True)
            image_clip = zero_shot.visual(images)
            image_clip = image_clip / image_clip.norm(dim=-1, keepdim=True)
            logits, logits_rep, fused, image_features, text_features = model(images)
            loss = getattr(module, loss_class)(reg_weight=node.REG_WEIGHT, alpha=node.ALPHA)(
                logits, logits_rep, image_features, text_features, image_clip, text_clip, labels)
        return {"logits": fused, "cls_logits": logits, "rep_logits": logits_rep, "loss": loss}
    return run_official


def _pairs(kinds, first, second):
    """The our-names of two layers' values in both towers, for ``swap``: ([first's], [second's])."""
    names = [(f"representation.{tower}.{first}".format(kind), f"representation.{tower}.{second}".format(kind))
             for tower in ("visual", "text") for kind in kinds]
    return [a for a, _ in names], [b for _, b in names]


# Representation tokens one block early: every output moves.
EARLY = Mutation("representation tokens one block early", node={"REP_LAYERS": [layer - 1 for layer in LAYERS]},
                 fails=OUTPUTS)
MMRL_MUTATIONS = (EARLY, Mutation("projector copies of layers 6 and 7 swapped",
                                  values=swap(*_pairs(("weight", "bias"), "0.{}", "1.{}")), fails=OUTPUTS))
MMRLPP_MUTATIONS = (EARLY,
                    # β and 1 − β exchanged (0.3 instead of OxfordPets' 0.7) in both towers
                    Mutation("blend weights swapped", node={"BETA": 0.3}, fails=OUTPUTS),
                    # the first and third representation layers' (6 and 8): with adjacent ones (6 and 7)
                    # the logits move by 3e-2 but the loss by 2.7e-3, under the contract's 3e-3
                    Mutation("residuals of two layers swapped",
                             values=swap(*_pairs(("a", "b"), "residuals.0.{}", "residuals.2.{}")), fails=OUTPUTS))


def _spec(node_name, official_cfg, our_node, learnables, build_ours, loss_class, mutations, gpu_acceptance=False):
    return MethodSpec(
        name=node_name,
        repository="yunncheng/MMRL",
        official_module=f"trainers.{node_name.lower()}",
        dataset="OxfordPets",
        # upstream's CUSTOM_TEMPLATES["OxfordPets"], ours the dataset's
        options={"template": "a photo of a {}, a type of pet."},
        official_cfg={f"TRAINER.{node_name}": official_cfg},
        our_node=our_node,
        learnables=learnables,
        official_learnable_prefixes=("representation_learner.", "image_encoder.proj_rep", "image_encoder.A",
                                     "image_encoder.B"),
        outputs=OUTPUTS,
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        build_official=_build_official(node_name),
        run_official=_run_official(node_name, loss_class),
        mutations=mutations,
        # its configs set PREC "amp"
        cost=CostSpec(trainer=node_name, official_prec="amp", gpu_acceptance=gpu_acceptance),
    )


PP = {"BETA": 0.7, "RES_LORA_DIM": 4, "PROJ_LORA_DIM": 64}  # β of OxfordPets (upstream's B2N table)
SPECS = (
    _spec("MMRL", dict(NODE), dict(NODE, INFERENCE="fusion"), mmrl_learnables(), build_mmrl, "MMRL_Loss",
          MMRL_MUTATIONS, gpu_acceptance=True),
    _spec("MMRLpp", dict(NODE, **PP), dict(NODE, INFERENCE="fusion", **PP), mmrlpp_learnables(), build_mmrlpp,
          "MMRLpp_Loss", MMRLPP_MUTATIONS),
)
