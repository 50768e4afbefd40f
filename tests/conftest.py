"""Shared fixtures: tiny random CLIP models saved to local files."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# A CLIP small enough for unit tests: ViT with 3 blocks of 4 heads, text with 2 blocks.
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 64, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
}


def write_tiny_clip(directory, name="tiny-clip-test", config=TINY_CLIP_CONFIG, seed=0):
    """Write an open_clip model-config JSON and random weights; return (config, weights) paths."""
    import open_clip

    config_path = os.path.join(directory, f"{name}.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    open_clip.add_model_config(config_path)
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    # Random init leaves some tensors at exactly zero/one; perturb so tests see them.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    weights_path = os.path.join(directory, f"{name}.pt")
    torch.save(model.state_dict(), weights_path)
    return config_path, weights_path


@pytest.fixture(scope="session")
def tiny_clip_files(tmp_path_factory):
    """(config_json, weights_pt) of a tiny random CLIP, shared by the session."""
    return write_tiny_clip(str(tmp_path_factory.mktemp("tiny_clip")))
