"""RAda (EFT) and its mask generator on tiny random CLIPs (ViT and ModifiedResNet towers)."""
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import runner_and_tokenizer, toy_pets_cfg, trainer_node

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.config import ConfigError
from vlprompt.engine import build_trainer
from vlprompt.methods.rada import RAdaCLIP, check_rada_node
from vlprompt.methods.rada_rational import RationalMaskGenerator, mask_regularizer, rational_logits, rational_matrix
from vlprompt.methods.template_head import TemplateCLIP
from vlprompt.testing import TINY_RESNET_CLIP_CONFIG, write_oxford_pets_tree, write_tiny_clip

CLASSES = ["red star", "blue circle", "green square", "golden retriever", "cat"]
TEMPLATES = ["a photo of a {}."]


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def resnet_clip_files(tmp_path_factory):
    return write_tiny_clip(str(tmp_path_factory.mktemp("tiny_rn")), name="tiny-rn-clip-test", config=TINY_RESNET_CLIP_CONFIG)


def rada_node(**changes):
    return trainer_node("RADA", **changes)


def build_models(clip_files, **changes):
    """(RAdaCLIP, TemplateCLIP) on the same frozen CLIP."""
    clip, tokenizer = runner_and_tokenizer(clip_files)
    torch.manual_seed(0)
    return (RAdaCLIP(clip, tokenizer, CLASSES, TEMPLATES, rada_node(**changes)),
            TemplateCLIP(clip, tokenizer, CLASSES, TEMPLATES))


def images(batch=4, seed=1):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def perturb(module, std=0.5, seed=3):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(std * torch.randn(param.shape, generator=generator))


# -------------------------------------------------------------------- mask generator

def reference_mask(generator, f, t, scale):
    """The paper's mask generator (Eq. 6) written out head by head with explicit attention maps."""
    heads, dim = generator.num_heads, f.shape[1]
    dh = dim // heads
    num_classes = t.shape[0]
    masks = []
    for image in f:
        rational = scale * image[None, :] * t  # [K, D]
        queries = [
            generator.q_image(math.sqrt(scale) * image).expand(num_classes, dim),
            generator.q_text(math.sqrt(scale) * t),
            generator.q_rational(rational),
        ]
        key, value = generator.key(rational), generator.value(rational)
        merged = []
        for h in range(heads):
            part = slice(h * dh, (h + 1) * dh)
            maps = []
            for query in queries:
                scores = query[:, part] @ key[:, part].T / (math.sqrt(dh) * generator.temperature)
                if generator.attn_norm == "row":
                    maps.append(scores.softmax(dim=1))
                else:
                    maps.append(scores.flatten().softmax(0).view_as(scores) * num_classes)
            merged.append(sum(maps) / 3 @ value[:, part])
        masks.append(torch.relu(1 + generator.out(torch.cat(merged, dim=1))))
    return torch.stack(masks)


def normalised(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_mask_is_all_ones_at_initialisation():
    generator = RationalMaskGenerator(32, num_heads=8)
    mask = generator(normalised(3, 32), normalised(6, 32, seed=1), torch.tensor(14.3))
    assert mask.shape == (3, 6, 32)
    assert torch.equal(mask, torch.ones_like(mask))


@pytest.mark.parametrize("attn_norm, temperature", [("row", 1.0), ("row", 0.5), ("global", 1.0), ("global", 0.3)])
def test_mask_generator_matches_the_specification(attn_norm, temperature):
    torch.manual_seed(0)
    generator = RationalMaskGenerator(32, num_heads=8, attn_norm=attn_norm, temperature=temperature)
    perturb(generator.out, std=0.3)
    f, t = normalised(3, 32), normalised(6, 32, seed=1)
    with torch.no_grad():
        expected = reference_mask(generator, f, t, 14.3)
        got = generator(f, t, torch.tensor(14.3))
    assert (got != 1).float().mean() > 0.3
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_chunking_over_images_does_not_change_the_mask():
    torch.manual_seed(0)
    whole = RationalMaskGenerator(32, num_heads=4, attn_norm="global")
    perturb(whole.out)
    chunked = RationalMaskGenerator(32, num_heads=4, attn_norm="global", chunk_size=2)
    chunked.load_state_dict(whole.state_dict())
    f, t = normalised(5, 32), normalised(7, 32, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(chunked(f, t, torch.tensor(10.0)), whole(f, t, torch.tensor(10.0)))


def test_mask_regulariser_matches_hand_computation():
    # Two images, K = 2 classes, D = 2: deviations M - 1 are
    # image 0: [[3, 0], [0, -4]]  image 1: [[0, 1], [0, 0]]
    mask = torch.tensor([[[4.0, 1.0], [1.0, -3.0]], [[1.0, 2.0], [1.0, 1.0]]])
    assert mask_regularizer(mask, "l2").item() == pytest.approx((5.0 + 1.0) / 2)  # ||.||_2 = 5 and 1
    assert mask_regularizer(mask, "linf").item() == pytest.approx((4.0 + 1.0) / 2)
    assert mask_regularizer(mask, "l1").item() == pytest.approx((3 + 4 + 1) / 8)
    assert mask_regularizer(mask, "mse").item() == pytest.approx((9 + 16 + 1) / 8)
    with pytest.raises(ValueError, match="Unknown mask loss"):
        mask_regularizer(mask, "l3")


def test_rational_logits_with_ones_are_scaled_cosines():
    f, t = normalised(3, 16), normalised(5, 16, seed=2)
    rational = rational_matrix(f, t)
    torch.testing.assert_close(rational_logits(rational, torch.ones_like(rational), 7.0), 7.0 * f @ t.T)


# -------------------------------------------------------------------------- RAda model

@pytest.mark.parametrize("backbone", ["vit", "resnet"])
def test_rada_at_initialisation_is_zero_shot_clip(backbone, tiny_clip_files, resnet_clip_files):
    files = tiny_clip_files if backbone == "vit" else resnet_clip_files
    rada, zero_shot = build_models(files)
    rada.eval(), zero_shot.eval()
    with torch.no_grad():
        batch = images()
        torch.testing.assert_close(rada(batch), zero_shot(batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize("backbone", ["vit", "resnet"])
def test_rada_trains_only_the_mask_generator(backbone, tiny_clip_files, resnet_clip_files):
    files = tiny_clip_files if backbone == "vit" else resnet_clip_files
    rada, _ = build_models(files, MASK_LOSS="linf")
    before = copy.deepcopy(rada.state_dict())
    optimizer = torch.optim.Adam(rada.mask_generator.parameters(), lr=0.01)
    labels = torch.tensor([0, 1, 2, 3])
    for _ in range(2):  # W_o is zero at first, so the other projections move from step 2
        loss, logits, terms = rada.loss(images(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert logits.shape == (4, len(CLASSES)) and set(terms) == {"ce", "mask_loss"}
    after = rada.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    generator_names = {f"mask_generator.{name}" for name in rada.mask_generator.state_dict()}
    assert changed == generator_names
    assert all(not p.requires_grad for p in rada.clip.parameters())


def test_trained_mask_changes_predictions_and_is_regularised(tiny_clip_files):
    rada, zero_shot = build_models(tiny_clip_files)
    perturb(rada.mask_generator, std=0.2)
    rada.eval(), zero_shot.eval()
    with torch.no_grad():
        assert not torch.allclose(rada(images()), zero_shot(images()), atol=1e-3)
        features = F.normalize(rada.encode_image_features(images()), dim=-1)
        _, mask = rada.rational(features, rada.class_text_features(), rada.logit_scale)
    assert (mask >= 0).all() and mask_regularizer(mask, "l2") > 0


def test_config_checks_name_the_key():
    with pytest.raises(ConfigError, match="TRAINER.RADA.ATTN_NORM"):
        check_rada_node(rada_node(ATTN_NORM="column"), "TRAINER.RADA")
    with pytest.raises(ConfigError, match="TEMP > 0"):
        check_rada_node(rada_node(TEMP=0.0), "TRAINER.RADA")
    with pytest.raises(ConfigError, match="TEMPLATE"):
        check_rada_node(rada_node(TEMPLATE="a photo"), "TRAINER.RADA")


# ------------------------------------------------------------------------- trainer

def trainer_cfg(data_root, output_dir, clip_files, *opts):
    return toy_pets_cfg("RAda", "RAda/toy.yaml", data_root, output_dir, clip_files, *opts)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rada_data"))
    write_oxford_pets_tree(root, train=4, val=1, test=2)
    return root


def test_resnet_trainer_trains_and_evaluates(data_root, resnet_clip_files, tmp_path):
    cfg = trainer_cfg(data_root, tmp_path / "run", resnet_clip_files, "OPTIM.MAX_EPOCH", "2")
    trainer = build_trainer(cfg)
    initial = copy.deepcopy(trainer.model.mask_generator.state_dict())
    trainer.train()
    assert trainer.last_test["num_samples"] == 10
    assert os.path.isfile(tmp_path / "run" / "mask_generator" / "model.pth.tar-2")
    trained = trainer.model.mask_generator.state_dict()
    assert all(not torch.equal(initial[name], trained[name]) for name in initial)
