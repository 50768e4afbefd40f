"""CLIP-Adapter on tiny random CLIPs: the adapter formula, what trains, ResNet towers, config checks."""
import copy
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import runner_and_tokenizer, toy_pets_cfg, trainer_node

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.config import ConfigError
from vlprompt.engine import build_trainer
from vlprompt.methods.feature_adapters import Adapter, CLIPAdapterCLIP, check_adapter_node
from vlprompt.methods.template_head import TemplateCLIP
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, TINY_RESNET_CLIP_CONFIG, write_oxford_pets_tree, write_tiny_clip

CLASSES = ["red star", "blue circle", "green square"]


def adapter_node(**changes):
    return trainer_node("CLIPADAPTER", **changes)


def build(clip_files, **changes):
    clip, tokenizer = runner_and_tokenizer(clip_files)
    torch.manual_seed(0)
    return (CLIPAdapterCLIP(clip, tokenizer, CLASSES, ["a photo of a {}."], adapter_node(**changes)),
            TemplateCLIP(clip, tokenizer, CLASSES, ["a photo of a {}."]))


def images(batch=3):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_adapter_blends_the_bottleneck_mlp_with_its_input():
    torch.manual_seed(0)
    adapter = Adapter(8, reduction=4, ratio=0.2, zero_init=False)
    x = torch.randn(5, 8)
    hidden = torch.clamp(x @ adapter.down.weight.T, min=0)
    expected = 0.8 * x + 0.2 * torch.clamp(hidden @ adapter.up.weight.T, min=0)
    torch.testing.assert_close(adapter(x), expected)
    assert adapter.down.weight.shape == (2, 8) and adapter.down.bias is None


def test_zero_initialised_adapters_start_at_zero_shot_clip(tiny_clip_files):
    model, zero_shot = build(tiny_clip_files, IMAGE_RATIO=0.5, TEXT_RATIO=0.5, ZERO_INIT=True)
    model.eval(), zero_shot.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(images()), zero_shot(images()), rtol=0, atol=1e-5)


def test_training_changes_only_the_image_adapter(tiny_clip_files):
    model, zero_shot = build(tiny_clip_files)
    assert model.adapters.text is None  # TEXT_RATIO 0: CLIP-Adapter's default
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.adapters.parameters(), lr=0.5)
    loss, logits, _ = model.loss(images(), torch.tensor([0, 1, 2]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    after = model.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {"adapters.image.down.weight", "adapters.image.up.weight"}
    model.eval(), zero_shot.eval()
    with torch.no_grad():
        assert not torch.allclose(model(images()), zero_shot(images()))


def test_config_checks():
    with pytest.raises(ConfigError, match="IMAGE_RATIO must be in"):
        check_adapter_node(adapter_node(IMAGE_RATIO=1.5), "TRAINER.CLIPADAPTER")
    with pytest.raises(ConfigError, match="nothing to train"):
        check_adapter_node(adapter_node(IMAGE_RATIO=0.0), "TRAINER.CLIPADAPTER")


def test_trainer_runs_on_a_resnet_clip_with_cached_features(tmp_path):
    clip_files = write_tiny_clip(str(tmp_path / "clip"), name="tiny-rn-adapter", config=TINY_RESNET_CLIP_CONFIG)
    write_oxford_pets_tree(str(tmp_path / "data"), classes=OXFORD_PETS_TOY_CLASSES[:3], train=4, val=1, test=2)
    cfg = toy_pets_cfg("CLIPAdapter", "CLIPAdapter/toy.yaml", str(tmp_path / "data"), tmp_path / "run", clip_files,
                       "OPTIM.MAX_EPOCH", "2")
    trainer = build_trainer(cfg)
    initial = copy.deepcopy(trainer.model.adapters.state_dict())
    trainer.train()
    assert trainer.feature_cache is not None and trainer.last_test["num_samples"] == 6
    trained = trainer.model.adapters.state_dict()
    assert all(not torch.equal(initial[name], trained[name]) for name in initial)
    assert os.path.isfile(tmp_path / "run" / "adapter" / "model.pth.tar-2")
    features = F.normalize(torch.randn(2, 32), dim=-1)
    assert trainer.model.forward_features(features).shape == (2, 3)
