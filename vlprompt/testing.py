"""Small artefacts for tests and smoke runs: a tiny random CLIP and a miniature dataset.

Nothing here is a benchmark: the tiny CLIP has random weights and the images are
coloured squares. They let the real loading code and the real command line run in
seconds on a CPU.
"""
import json
import os
import random

import numpy as np
import torch
from PIL import Image

from vlprompt.utils import atomic_write, write_json

__all__ = [
    "TINY_CLIP_CONFIG", "tiny_clip_config", "TINY_RESNET_CLIP_CONFIG", "FAMILY_TEST_CONFIGS", "write_tiny_clip", "write_oxford_pets_tree",
    "OXFORD_PETS_TOY_CLASSES",
]

# ViT image tower with 3 blocks of 4 heads (32x32 input, 16 patches), text tower with
# 2 blocks of 4 heads and context length 32; QuickGELU like OpenAI's models.
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 64, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
}



def tiny_clip_config(image_blocks, text_blocks):
    """TINY_CLIP_CONFIG with ``image_blocks`` image and ``text_blocks`` text blocks."""
    return dict(TINY_CLIP_CONFIG, vision_cfg=dict(TINY_CLIP_CONFIG["vision_cfg"], layers=image_blocks),
                text_cfg=dict(TINY_CLIP_CONFIG["text_cfg"], layers=text_blocks))


# The same CLIP with a ModifiedResNet image tower (one bottleneck per stage, attention pooling
# with 4 heads), for methods that must run on ResNet CLIPs (RN50, RN101).
TINY_RESNET_CLIP_CONFIG = dict(
    TINY_CLIP_CONFIG, vision_cfg={"image_size": 32, "layers": [1, 1, 1, 1], "width": 8, "head_width": 64},
)

# One small random model per model family the runner drives (open_clip model configs; the timm
# image towers are registered by vlprompt.clip.small_models). Text towers: open_clip's
# TextTransformer with CLIP's tokenizer (context length 32); SigLIP's is bidirectional, pooled at
# the last position, with a projection bias, and the model scores with a logit bias.
_CAUSAL_TEXT = {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 4}
FAMILY_TEST_CONFIGS = {
    "openai": TINY_CLIP_CONFIG,
    "siglip": {
        "embed_dim": 32, "init_logit_bias": -10, "custom_text": True,
        "vision_cfg": {"image_size": 32, "timm_model_name": "vlprompt_tiny_siglip", "timm_model_pretrained": False,
                       "timm_pool": "map", "timm_proj": "none"},
        "text_cfg": dict(_CAUSAL_TEXT, no_causal_mask=True, proj_bias=True, pool_type="last",
                         norm_kwargs={"eps": 1e-6}, act_kwargs={"approximate": "tanh"}),
    },
    "eva02": {
        "embed_dim": 24, "custom_text": True,
        "vision_cfg": {"image_size": 32, "timm_model_name": "vlprompt_tiny_eva02", "timm_model_pretrained": False,
                       "timm_pool": "token", "timm_proj": None},
        "text_cfg": _CAUSAL_TEXT,
    },
    "pe_core": {
        "embed_dim": 24, "custom_text": True,
        "vision_cfg": {"image_size": 32, "timm_model_name": "vlprompt_tiny_pe_core", "timm_model_pretrained": False,
                       "timm_pool": "map", "timm_proj": None},
        "text_cfg": _CAUSAL_TEXT,
    },
    "vit_reg": {
        "embed_dim": 24, "custom_text": True,
        "vision_cfg": {"image_size": 32, "timm_model_name": "vlprompt_tiny_vit_reg", "timm_model_pretrained": False,
                       "timm_pool": "token", "timm_proj": "linear"},
        "text_cfg": _CAUSAL_TEXT,
    },
}

# Breeds in OxfordPets' label order (a subset: labels are renumbered 0..N-1).
OXFORD_PETS_TOY_CLASSES = ("Abyssinian", "american_bulldog", "Bengal", "boxer", "Persian")


def write_tiny_clip(directory, name="tiny-clip", config=None, seed=0):
    """Write an open_clip model config ``<name>.json`` and random weights ``<name>.pt``.

    Returns:
        (config_path, weights_path), usable as MODEL.BACKBONE.NAME / MODEL.BACKBONE.WEIGHTS.
    """
    import open_clip

    from vlprompt.clip.loading import backbone_config

    os.makedirs(directory, exist_ok=True)
    config_path = os.path.join(directory, f"{name}.json")
    with atomic_write(config_path, "w") as f:
        json.dump(config or TINY_CLIP_CONFIG, f, indent=2)
    backbone_config(config_path)  # registered with open_clip, as are the project's small timm towers
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    with torch.no_grad():  # random init leaves exact zeros/ones; perturb them
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    torch.random.set_rng_state(generator_state)
    weights_path = os.path.join(directory, f"{name}.pt")
    with atomic_write(weights_path, "wb") as f:
        torch.save(model.state_dict(), f)
    return config_path, weights_path


def write_family_clip(directory, family, seed=0):
    """``write_tiny_clip`` of ``FAMILY_TEST_CONFIGS[family]``, named ``tiny-<family>-clip``.

    The SigLIP-family model is named ``tiny-sigmoid-clip``: open_clip gives a model whose
    name contains "siglip" SigLIP's own tokenizer, which it downloads.
    """
    name = f"tiny-{family.replace('siglip', 'sigmoid')}-clip"
    return write_tiny_clip(directory, name=name, config=FAMILY_TEST_CONFIGS[family], seed=seed)


def _class_image(label, index, size=40):
    """A square of a class-specific colour with mild noise (deterministic)."""
    rng = np.random.default_rng(1000 * label + index)
    hue = np.array([(label * 67) % 256, (label * 131 + 40) % 256, (label * 29 + 90) % 256], dtype=np.float32)
    pixels = hue + rng.normal(0, 12, size=(size, size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES, train=8, val=2, test=4):
    """Write a miniature ``oxford_pets/`` folder in the real layout with its split JSON.

    Layout: ``root/oxford_pets/images/<Breed>_<n>.jpg`` and
    ``root/oxford_pets/split_zhou_OxfordPets.json`` (entries [file, label, classname]).

    Returns:
        The dataset folder.
    """
    dataset_dir = os.path.join(root, "oxford_pets")
    image_dir = os.path.join(dataset_dir, "images")
    os.makedirs(image_dir, exist_ok=True)
    split = {"train": [], "val": [], "test": []}
    for label, breed in enumerate(classes):
        counts = (("train", train), ("val", val), ("test", test))
        index = 0
        for part, count in counts:
            for _ in range(count):
                index += 1
                name = f"{breed}_{index}.jpg"
                _class_image(label, index).save(os.path.join(image_dir, name), quality=95)
                split[part].append([name, label, breed.lower()])
    for part in split:
        random.Random(part).shuffle(split[part])
    write_json(split, os.path.join(dataset_dir, "split_zhou_OxfordPets.json"))
    return dataset_dir
