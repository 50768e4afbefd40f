"""TAC against FushengHao/TAC's trainers/tac.py (its own clip/model.py, the IVLP blocks with the
cluster tokens and the patch mask).

Compared: the logits [B, C] (evaluation) and the training loss CE + 20·L1(t̂, ê) + 25·L1(f̂, f̂_0)
over 2 views of each image (the batch and its horizontal flip; x_0 = the batch), with every
learnable value (T_1, the 11 deep text and 12 vision prompts, the maps G -> G_t and G -> G_v)
drawn away from its init and the same seeded unit centres G on both sides. Upstream's loss is
summed in its trainer's forward_backward from what its model returns in training mode; here
those three lines are repeated on the official model's outputs. Stand-ins on the official side:
``.cuda()`` is a no-op, ``kmeans_pytorch`` (not installed) returns placeholder centres (both sides
then get the seeded G), the image dropout is switched off for the loss (it draws random masks),
and the descriptions file upstream reads from ``./descriptions/`` is written from DESCRIPTIONS.
Upstream casts its prompts to fp16 inside the towers (``.half()``), so its prompt values are
rounded to fp16 where ours stay fp32.
"""
import json
import os
import sys
import types

import torch
import torch.nn.functional as F

from vlprompt.fileio import atomic_write

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, flip, swap

NODE = {"N_CTX_VISION": 5, "N_CTX_TEXT": 5, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH_VISION": 12,
        "PROMPT_DEPTH_TEXT": 12, "TEXT_LOSS_WEIGHT": 20, "IMAGE_LOSS_WEIGHT": 25, "N_CLUSTERS": 5, "DROPOUT": 0.3,
        "DESCRIPTIONS": ""}
VIEWS = 2
CENTRES_SEED = 4
DATASET = "OxfordPets"
DESCRIPTION_FILE = "oxford_pets_prompt.json"  # upstream's name for DATASET


def descriptions(classnames):
    """Two descriptions per class, {class name: [sentence, sentence]} (upstream's JSON format)."""
    return {name: [f"a photo of a {name}.", f"a close-up picture of a {name} in bright light."] for name in classnames}


def centres(embed_dim=512):
    """The seeded unit cluster centres G [5, E] both sides use."""
    generator = torch.Generator().manual_seed(CENTRES_SEED)
    return F.normalize(torch.randn(NODE["N_CLUSTERS"], embed_dim, generator=generator), dim=-1)


def tac_learnables(depth=12, text_width=512, vision_width=768, embed_dim=512, n_ctx=5):
    """Our name -> {official name, shape, init std}: T_1 and the deep prompts N(0, 0.02); the maps
    (nn.Linear's init U(±1/sqrt(fan_in)), std 1/sqrt(3·fan_in))."""
    entries = {"ctx": Learnable("prompt_learner.ctx", 0.02, (n_ctx, text_width))}
    for ours, official, width in (("text_map", "VPT_topk_t", text_width), ("vision_map", "VPT_topk_v", vision_width)):
        for kind, shape in (("weight", (width, embed_dim)), ("bias", (width,))):
            entries[f"{ours}.{kind}"] = Learnable(f"{official}.{kind}", (3 * embed_dim) ** -0.5, shape)
    for layer in range(1, depth):
        entries[f"text_prompts.{layer - 1}"] = Learnable(
            f"text_encoder.transformer.resblocks.{layer}.VPT_shallow", 0.02, (n_ctx, text_width))
        entries[f"vision_prompts.{layer}"] = Learnable(
            f"image_encoder.transformer.resblocks.{layer}.VPT_shallow", 0.02, (n_ctx, vision_width))
    entries["vision_prompts.0"] = Learnable("image_encoder.VPT", 0.02, (n_ctx, vision_width))
    return entries


LEARNABLES = tac_learnables()


def build_ours(clip, tokenizer, classnames, node, spec):
    """TACCLIP with the seeded centres and the description embeddings of DESCRIPTIONS."""
    from trainers.tac import TACCLIP

    model = TACCLIP(clip, tokenizer, classnames, node)
    with torch.no_grad():
        model.centres.copy_(centres(model.centres.shape[1]))
    table = descriptions(classnames)
    model.fit_descriptions([table[name] for name in classnames], torch.Generator().manual_seed(0))
    return model


def _views(images):
    """(views [VIEWS·B, 3, R, R] view-major: the batch, then its flip; originals [B, 3, R, R])."""
    return torch.cat([images, images.flip(-1)]), images


def run_ours(model, node, images, labels):
    with torch.no_grad():
        logits = model(images)
        model.train()
        model.dropout.eval()
        loss, _, _ = model.loss(_views(images), labels.repeat(VIEWS))
        model.eval()
    return {"logits": logits, "loss": loss}


def prepare_official(cfg, weights_path):
    """No-op ``.cuda()``, a ``kmeans_pytorch`` stand-in, the descriptions file, TAC's loader keys."""
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self
    stand_in = types.ModuleType("kmeans_pytorch")
    stand_in.kmeans = lambda X, num_clusters, distance, device: (None, X.new_ones(num_clusters, X.shape[1]))
    sys.modules["kmeans_pytorch"] = stand_in
    cfg.DATALOADER.K_TRANSFORMS = VIEWS
    cfg.DATALOADER.RETURN_IMG0 = True
    workdir = os.path.dirname(weights_path)  # the official side's working directory
    with open(os.path.join(workdir, "request.json")) as f:
        classnames = json.load(f)["classnames"]
    with atomic_write(os.path.join(workdir, "descriptions", DESCRIPTION_FILE), "w") as f:
        json.dump(descriptions(classnames), f)


def run_official(module, cfg, request, model, images, labels):
    """Logits in evaluation; in training mode (dropout off) the three loss terms of upstream's
    ``TAC.forward_backward`` on what ``CustomCLIP.forward`` returns."""
    with torch.no_grad():
        model.prompt_learner.topk.copy_(centres())
        logits = model(images)
        model.train()
        for submodule in model.modules():
            if isinstance(submodule, torch.nn.Dropout):
                submodule.eval()
        views, originals = _views(images)
        outputs, text, fixed, zero_shot, image = model(views, labels, originals)
        node = cfg.TRAINER.TAC
        loss = (F.cross_entropy(outputs, labels.repeat(VIEWS)) + F.l1_loss(text, fixed) * node.TEXT_LOSS_WEIGHT
                + F.l1_loss(image, zero_shot) * node.IMAGE_LOSS_WEIGHT)
    return {"logits": logits, "loss": loss}


def other_centres():
    """Build our model with other unit centres G (another seed, rolled by one)."""
    from unittest import mock

    def rolled(embed_dim=512):
        generator = torch.Generator().manual_seed(9)
        return torch.roll(F.normalize(torch.randn(NODE["N_CLUSTERS"], embed_dim, generator=generator), dim=-1), 1, 0)

    return mock.patch(f"{__name__}.centres", rolled)


SPECS = (
    MethodSpec(
        name="TAC",
        repository="FushengHao/TAC",
        # the ImageNet description files (tens of MB, unused here) are missing from stored snapshots
        archive_exclude=("descriptions/imagenet*",),
        official_module="trainers.tac",
        dataset=DATASET,
        official_cfg={"TRAINER.TAC": {key: NODE[key] for key in (
            "N_CTX_VISION", "N_CTX_TEXT", "CTX_INIT", "PREC", "PROMPT_DEPTH_VISION", "PROMPT_DEPTH_TEXT",
            "TEXT_LOSS_WEIGHT", "IMAGE_LOSS_WEIGHT")}},
        our_node=dict(NODE),
        learnables=LEARNABLES,
        official_learnable_prefixes=tuple(entry.official for entry in LEARNABLES.values()),
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        run_official=run_official,
        mutations=(
            Mutation("ctx tokens reversed", values=flip("ctx")),
            Mutation("deep text prompts of layers 2 and 3 swapped", values=swap("text_prompts.0", "text_prompts.1")),
            Mutation("vision prompts of layers 1 and 2 swapped", values=swap("vision_prompts.0", "vision_prompts.1")),
            Mutation("vision map bias rows reversed", values=flip("vision_map.bias")),
            Mutation("other centres", patch=other_centres),
        ),
        # Timing: the recipe's 4 views of each image (configs/trainers/TAC/basetonovel.yaml, upstream's
        # K_TRANSFORMS 4) and the un-augmented image on both sides; the unprompted CLIP of its IVLP clip
        # package (the frozen unit): upstream's zero-shot design.
        cost=CostSpec(trainer="TAC", train_cfg={"DATALOADER.K_TRANSFORMS": 4}, plain_design={
            "trainer": "IVLP", "vision_depth": 0, "language_depth": 0, "vision_ctx": 0, "language_ctx": 0}),
    ),
)
