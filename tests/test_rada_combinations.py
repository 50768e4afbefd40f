"""RAda + Adapter and RAda + Prompt on a tiny random CLIP: start points, what trains, trainers."""
import copy
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import runner_and_tokenizer, toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from trainers.rada_adapter import RAdaAdapterCLIP
from trainers.rada_prompt import RAdaPromptCLIP
from vlprompt.clip import fill_template, imagenet_templates
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file
from vlprompt.engine import build_trainer
from vlprompt.methods.independent_prompts import IVLPCLIP
from vlprompt.methods.template_head import TemplateCLIP
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
    settings = node("RAdaPrompt", FROZEN_TEXT_WEIGHT=0.0)  # prompted class features only, as IVLP
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


def frozen_ensemble(model, classnames):
    """Mean over CLIP's 80 ImageNet templates of the frozen text features [K, E], one template at a time."""
    per_template = []
    with torch.no_grad():
        for template in imagenet_templates():
            ids = model.tokenizer([fill_template(template, name) for name in classnames])
            per_template.append(model.encode_sentences(ids).float())
    return torch.stack(per_template).mean(dim=0)


def test_rada_prompt_averages_prompted_and_frozen_ensemble_class_features(tiny_clip_files):
    """Official PromptRAda: t = normalise((t_prompt + t~) / 2); the mask is 1 at step 0."""
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    settings = node("RAdaPrompt")
    assert settings.FROZEN_TEXT_WEIGHT == 0.5
    torch.manual_seed(0)
    model = RAdaPromptCLIP(clip, tokenizer, CLASSES, settings).eval()
    torch.manual_seed(0)
    ivlp = IVLPCLIP(clip, tokenizer, CLASSES, settings).eval()
    with torch.no_grad():
        prompted = ivlp.compute_text_features().float()
        mixed = F.normalize(prompted + frozen_ensemble(model, CLASSES), dim=-1)
        expected = ivlp.cosine_logits(ivlp.image_features(images()), mixed)
        torch.testing.assert_close(model(images()), expected, rtol=0, atol=1e-4)
        assert not torch.allclose(model(images()), ivlp(images()), atol=1e-2)
    model.prompt_learner.set_classnames(CLASSES[:2])  # the ensemble follows the class list
    torch.testing.assert_close(model.frozen_text_features(), frozen_ensemble(model, CLASSES[:2]), rtol=0, atol=1e-5)


def test_rada_prompt_loss_is_cross_entropy_only_with_alpha_zero(tiny_clip_files):
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    model = RAdaPromptCLIP(clip, tokenizer, CLASSES, node("RAdaPrompt", ALPHA=0.0))
    train_steps(model)  # the mask moves away from 1, so L_mask > 0
    labels = torch.tensor([0, 1, 2, 3])
    loss, logits, terms = model.loss(images(), labels)
    assert terms["mask_loss"] > 0
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels), rtol=0, atol=0)


def merged(path):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, path))
    return cfg


def test_rada_prompt_default_config_is_the_official_prompt_rada_recipe():
    """configs/trainers/RAdaPrompt/vit_b16_c2_ep20_batch4_4+4ctx.yaml holds the content of the
    official file of that name and the loss of eft/trainers/prompt_rada.py (khufia/RAda)."""
    cfg = merged("configs/trainers/RAdaPrompt/vit_b16_c2_ep20_batch4_4+4ctx.yaml")
    node_ = cfg.TRAINER.RADAPROMPT
    assert (node_.N_CTX_VISION, node_.N_CTX_TEXT, node_.PROMPT_DEPTH_VISION, node_.PROMPT_DEPTH_TEXT) == (2, 2, 9, 9)
    assert (node_.FROZEN_TEXT_WEIGHT, node_.ALPHA, node_.ATTN_NORM, node_.TEMP) == (0.5, 0.0, "global", 1.0)
    assert (cfg.OPTIM.NAME, cfg.OPTIM.LR, cfg.OPTIM.MAX_EPOCH, cfg.DATALOADER.TRAIN_X.BATCH_SIZE) == ("sgd", 3e-4, 10, 1)
    assert (cfg.OPTIM.LR_SCHEDULER, cfg.OPTIM.WARMUP_EPOCH, cfg.OPTIM.WARMUP_CONS_LR) == ("cosine", 1, 1e-5)
    paper = merged("configs/trainers/RAdaPrompt/vit_b16_base2new_paper.yaml")
    assert (paper.OPTIM.LR, paper.OPTIM.MAX_EPOCH, paper.DATALOADER.TRAIN_X.BATCH_SIZE) == (0.0009, 13, 1)
    assert (paper.TRAINER.RADAPROMPT.ALPHA, paper.TRAINER.RADAPROMPT.MASK_LOSS) == (1.5, "l2")
    assert paper.TRAINER.RADAPROMPT.ATTN_NORM == "row"


def test_rada_prompt_rejects_a_frozen_text_weight_outside_zero_one(data_root, tiny_clip_files, tmp_path):
    cfg = toy_pets_cfg("RAdaPrompt", "RAdaPrompt/toy.yaml", data_root, tmp_path, tiny_clip_files,
                       "TRAINER.RADAPROMPT.FROZEN_TEXT_WEIGHT", "1.5")
    with pytest.raises(ConfigError, match="TRAINER.RADAPROMPT.FROZEN_TEXT_WEIGHT"):
        build_trainer(cfg)


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
