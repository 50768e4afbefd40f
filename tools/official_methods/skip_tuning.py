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
import sys
import types

import torch

KEEP_MASK = [True, True, False]
NODE = {"PREC": "fp32", "START_LAYER": 6, "TOP_RATIO": 0.5, "MAX_TOP": 50, "LAMBDA": 0.3, "KEEP_MASK": KEEP_MASK}


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.skip_tuning import TEMPLATES, SkipTuningCLIP

    model = SkipTuningCLIP(clip, tokenizer, classnames, TEMPLATES[spec["dataset"]], node.START_LAYER)
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


SPECS = {
    "SkipTuning": {
        "repository": "Koorye/SkipTuning",
        "code_dir": "",
        "official_module": "trainers.skip_tuning",
        "dataset": "OxfordPets",
        "labels": [0, 0],
        "official_cfg": {
            "TRAINER.SKIP": {"START_LAYER": 6, "TOP_RATIO": 0.5, "MAX_TOP": 50, "LAMBDA": 0.3, "DROP_RATIO": 0.0,
                             "QUICK_BATCH_SIZE": 128},
            "TRAINER.FINETUNE": {"LEARNABLE_TEXT": True, "LEARNABLE_IMAGE": True, "LEARNABLE_PREFIX_MODULES": "",
                                 "START_LAYER": 0},
        },
        "our_node": dict(NODE),
        "learnables": {},
        "official_learnable_prefixes": (),
        "outputs": ("logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours,
        "prepare_official": prepare_official,
        "run_official": run_official,
    },
}
