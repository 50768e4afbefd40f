"""RAda + Adapter and RAda + Prompt on a tiny random CLIP: start points, what trains, trainers."""
import copy
import os

import pytest
import torch
from baseline_setup import runner_and_tokenizer, toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from trainers.ivlp import IVLPCLIP
from trainers.rada_adapter import RAdaAdapterCLIP
from trainers.rada_prompt import RAdaPromptCLIP
from trainers.zsclip import TemplateCLIP
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file
from vlprompt.engine import build_trainer
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["red star", "blue circle", "green square", "cat"]
TEMPLATES = ["a photo of a {}."]


def node(name, **changes):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, f"configs/trainers/{name}/toy.yaml"))
    result = cfg.TRAINER[name.upper()]
    for key, value in changes.items():
        result[key] = value
    return result


def images(batch=4):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def train_steps(model, steps=2):
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    for _ in range(steps):  # W_o is zero at first, so the generator's projections move from step 2
        loss, _, terms = model.loss(images(), torch.tensor([0, 1, 2, 3]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert set(terms) == {"ce", "mask_loss"}


def changed_names(before, model):
    after = model.state_dict()
    return {name for name in before if not torch.equal(before[name], after[name])}


def test_rada_adapter_starts_at_zero_shot_clip_and_trains_adapters_and_generator(tiny_clip_files):
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    torch.manual_seed(0)
    model = RAdaAdapterCLIP(clip, tokenizer, CLASSES, TEMPLATES, node("RAdaAdapter")).eval()
    zero_shot = TemplateCLIP(clip, tokenizer, CLASSES, TEMPLATES).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(images()), zero_shot(images()), rtol=0, atol=1e-5)
    before = copy.deepcopy(model.state_dict())
    train_steps(model)
    changed = changed_names(before, model)
    assert {name.split(".")[0] for name in changed} == {"mask_generator", "adapters"}
    assert {"adapters.image.up.weight", "adapters.text.up.weight", "mask_generator.key.weight"} <= changed


def test_rada_prompt_starts_at_ivlp_and_trains_prompts_and_generator(tiny_clip_files):
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    settings = node("RAdaPrompt")
    torch.manual_seed(0)
    model = RAdaPromptCLIP(clip, tokenizer, CLASSES, settings).eval()
    torch.manual_seed(0)
    ivlp = IVLPCLIP(clip, tokenizer, CLASSES, settings).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(images()), ivlp(images()), rtol=0, atol=1e-5)
    before = copy.deepcopy(model.state_dict())
    train_steps(model)
    changed = changed_names(before, model)
    assert {name.split(".")[0] for name in changed} == {"mask_generator", "prompt_learner", "text_prompts",
                                                         "vision_prompts"}
    assert not any(name.startswith("clip.") for name in changed)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("combo_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:3], train=4, val=1, test=2)
    return root


@pytest.mark.parametrize("trainer, folders", [
    ("RAdaAdapter", ("mask_generator", "adapter")),
    ("RAdaPrompt", ("VLPromptLearner",)),
])
def test_trainers_train_and_save_their_parts(trainer, folders, data_root, tiny_clip_files, tmp_path):
    cfg = toy_pets_cfg(trainer, f"{trainer}/toy.yaml", data_root, tmp_path, tiny_clip_files, "OPTIM.MAX_EPOCH", "1")
    run = build_trainer(cfg)
    run.train()
    assert run.last_test["num_samples"] == 6
    for folder in folders:
        assert (tmp_path / folder / "model.pth.tar-1").is_file()
