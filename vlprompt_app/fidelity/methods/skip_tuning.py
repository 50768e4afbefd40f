"""Skip Tuning against Koorye/SkipTuning's trainers/skip_tuning.py (SkipCustomCLIP).

Compared, on the seeded random CLIP (whose blocks are what Skip Tuning tunes: no values are added
or drawn away from an init, so the mapping is empty): the inference logits [B, C] of the whole
model, and the training loss from the block-5 states of the images (upstream's
``forward_image_features``; ours ``image_prefix``) with the class-wise skip under a given keep
mask (upstream's ``reserve_mask``, set instead of drawn): classes ranked by their best similarity
to the zero-shot prototypes, the batch's class first; the kept classes' sentences continue from
their block-5 states. The labels [0, 0] make the rank of the other two classes depend on the
prototypes, and the mask keeps ranks 0 and 1 only.

Upstream's model class is ``SkipCustomCLIP`` and its CLIP loader lives in trainers/_base_/base.py:
``prepare_official`` exposes both under the names the harness reads (``CustomCLIP``,
``load_clip_to_cpu``), makes ``.cuda()`` a no-op (upstream moves the tokenized sentences to CUDA)
and stands in for ``torchinfo`` (imported for a model summary only).
"""
import math
import sys
import types

import torch

from ..spec import CostSpec, MethodSpec, Mutation

KEEP_MASK = [True, True, False]
NODE = {"PREC": "fp32", "START_LAYER": 6, "TOP_RATIO": 0.5, "MAX_TOP": 50, "LAMBDA": 0.3, "KEEP_MASK": KEEP_MASK}


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.skip_tuning import TEMPLATES, SkipTuningCLIP

    model = SkipTuningCLIP(clip, tokenizer, classnames, TEMPLATES[spec.dataset], node.START_LAYER)
    model.keep_mask = torch.tensor(node.KEEP_MASK)
    return model


def run_ours(model, node, images, labels):
    with torch.no_grad():
        logits = model(images)
        loss, _, _ = model.loss(model.image_prefix(images), labels)
    return {"logits": logits, "loss": loss}


def prepare_official(cfg, weights_path):
    sys.modules["torchinfo"] = types.ModuleType("torchinfo")
    sys.modules["torchinfo"].summary = None
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self
    import trainers.skip_tuning as official
    from trainers._base_.base import load_clip_to_cpu

    official.load_clip_to_cpu = load_clip_to_cpu
    official.CustomCLIP = official.SkipCustomCLIP


def run_official(module, cfg, request, model, images, labels):
    """Upstream's inference forward, then its training forward on the block-5 states [L, B, D]
    with the text states and prototypes its before_train sets."""
    with torch.no_grad():
        logits = model(images)
        text_medium, text_out = model.forward_text_features()
        model.text_features = text_medium
        model.class_prototypes = text_out / text_out.norm(dim=-1, keepdim=True)
        model.reserve_mask = torch.tensor(KEEP_MASK)
        image_medium, _ = model.forward_image_features(images)
        loss, _ = model(image_medium, labels)
    return {"logits": logits, "loss": loss}


# --------------------------------------------------------------------------- tools/benchmark.py official
# One step of the official recipe per batch of images: the per-epoch cache pass over these images
# (upstream's extract_image_features: forward_image_features under no_grad, which runs blocks 0..S-1
# and, for an output it discards, S..11 too) and forward_backward on their block-S states. Ours:
# the frozen blocks 0..S-1 (its cache pass per image), then its step. Both sides keep the same
# classes: KEPT ranks (the mask is random on both sides, drawn by different generators).

def benchmark_keep_mask(num_classes, node=NODE):
    """The keep mask over ranks [C] both sides time with: the n_top = min(⌈TOP_RATIO·C⌉, MAX_TOP)
    first ranks and, after them, as many ranks as the mask keeps on average (the sum of the
    min-max normalised exponential pdf over the remaining ranks, rounded)."""
    top = min(math.ceil(node["TOP_RATIO"] * num_classes), node["MAX_TOP"])
    rest = num_classes - top
    pdf = torch.exp(-torch.linspace(0.0, 5.0, rest, dtype=torch.float64) / node["LAMBDA"])
    expected = float(((pdf - pdf.min()) / (pdf.max() - pdf.min())).sum()) if rest > 1 else 0.0
    return torch.arange(num_classes) < top + round(expected)


def our_after_build(trainer):
    trainer.model.keep_mask = benchmark_keep_mask(len(trainer.classnames))


_DEVICE_COUNT = torch.cuda.device_count


def official_before_build(module, cfg):
    """Upstream's build_model asserts exactly one GPU: torch.cuda.device_count() is 1 while it builds."""
    torch.cuda.device_count = lambda: 1


def official_after_build(trainer):
    """What upstream's before_train sets: the class sentences' block-S text states and the zero-shot
    prototypes (forward_text_features), and the keep mask."""
    torch.cuda.device_count = _DEVICE_COUNT
    model = trainer.model
    with torch.no_grad():
        text_medium, text_out = model.forward_text_features()
    model.text_features = text_medium
    model.class_prototypes = text_out / text_out.norm(dim=-1, keepdim=True)
    model.reserve_mask = benchmark_keep_mask(model.num_classes)


def official_step(trainer, batch):
    """Upstream's cache pass over the batch's images, then its forward_backward on their states."""
    with torch.no_grad():
        image_medium, _ = trainer.model.forward_image_features(batch["img"])
    trainer.forward_backward((image_medium, batch["label"]))


def the_datasets_own_template():
    """Our TEMPLATES with the CoOp template of OxfordPets (upstream's is "a photo of a {}.")."""
    from unittest import mock

    from trainers.skip_tuning import TEMPLATES

    return mock.patch.dict(TEMPLATES, {"OxfordPets": "a photo of a {}, a type of pet."})


SPECS = (
    MethodSpec(
        name="SkipTuning",
        repository="Koorye/SkipTuning",
        official_module="trainers.skip_tuning",
        dataset="OxfordPets",
        labels=(0, 0),
        official_cfg={
            "TRAINER.SKIP": {"START_LAYER": 6, "TOP_RATIO": 0.5, "MAX_TOP": 50, "LAMBDA": 0.3, "DROP_RATIO": 0.0,
                             "QUICK_BATCH_SIZE": 128},
            "TRAINER.FINETUNE": {"LEARNABLE_TEXT": True, "LEARNABLE_IMAGE": True, "LEARNABLE_PREFIX_MODULES": "",
                                 "START_LAYER": 0},
        },
        our_node=dict(NODE),
        official_learnable_prefixes=(),
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours,
        prepare_official=prepare_official,
        run_official=run_official,
        mutations=(
            # the class of lower prototype similarity kept: the loss moves, the inference logits do not
            Mutation("another keep mask", node={"KEEP_MASK": [True, False, True]}, fails=("loss",),
                     still_match=("logits",)),
            Mutation("the dataset's own template", patch=the_datasets_own_template),
        ),
        cost=CostSpec(
            trainer="SkipTuning",
            # upstream's train.py (PREC; STAGED_LR with NEW_LAYERS image_encoder) and its vit_b16_bs4.yaml (the lrs)
            train_cfg={"TRAINER.PREC": "fp32", "OPTIM.STAGED_LR": True, "OPTIM.NEW_LAYERS": ["image_encoder"],
                       "OPTIM.LR": 2e-5, "OPTIM.NEW_LR": 5e-6},
            before_build=official_before_build,
            after_build=official_after_build,
            step=official_step,
            our_nodes={"TRAINER.SKIPTUNING": {key: NODE[key] for key in (
                "PREC", "START_LAYER", "TOP_RATIO", "MAX_TOP", "LAMBDA")}},
            our_after_build=our_after_build,
        ),
    ),
)
