"""MMRL++ (trainers/mmrlpp.py): the shared residual aligners P^l(R) = R (W + A^l B^l)ᵀ + b^l, the
β blend of the representation tokens at the later layers of both towers, proj_rep = proj + A_p B_p,
the loss, the per-dataset β / λ tables and the scope-dependent inference, checked against a hand
computation with open_clip's own blocks."""
import math

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import (  # noqa: F401
    build_seeded, deeper_runner, runner_and_tokenizer, toy_world, toy_world_cfg, trainer_node,
)
from trainer_checks import assert_fusion_and_class_token_inference, one_step_changes_only_the_learnable

from trainers.mmrlpp import (
    BASE2NEW_SETTINGS, INFERENCE_RULE, TARGET_BETA, MMRLppCLIP, check_mmrlpp_config, dataset_rule, resolved_node,
)
from vlprompt.config import ConfigError

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TEMPLATE = "a photo of a {}, a type of pet."
K, BETA, RANK, PROJ_RANK, REP_DIM = 3, 0.7, 2, 4, 16
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return deeper_runner(tmp_path_factory.mktemp("mmrlpp"), "tiny-clip-mmrlpp")  # representation layers 2..3


def build_model(runner, inference="fusion", perturb=True, **changes):
    """MMRL++ on the tiny CLIP; with ``perturb`` every learnable value (the zero Bs included) is
    redrawn at 10x its init scale, so that a misplaced token or a wrong blend moves the outputs."""
    clip, tokenizer = runner
    torch.manual_seed(0)
    settings = {"N_REP_TOKENS": K, "REP_LAYERS": [2, 3], "REP_DIM": REP_DIM, "REG_WEIGHT": 0.5, "BETA": BETA,
                "RES_LORA_DIM": RANK, "PROJ_LORA_DIM": PROJ_RANK}
    node = resolved_node(trainer_node("MMRLPP", **{**settings, **changes}), "OxfordPets", "base")
    model = MMRLppCLIP(clip, tokenizer, CLASSNAMES, TEMPLATE, node, node.REP_DIM, node.REG_WEIGHT, inference)
    if perturb:
        with torch.no_grad():
            for p in model.representation.parameters():
                p.copy_(torch.randn_like(p) * 10 * max(p.std().item(), 0.02))
    return model


def layer_map(aligner, layer, rep):
    residual = aligner.residuals[layer]
    return rep @ (aligner.weight + residual.a @ residual.b).t() + aligner.bias[layer]


def hand_image(model, images, beta=BETA):
    """(f_cls, f_rep) with open_clip's blocks: insertion at block 1, blend at block 2."""
    visual, rep = model.clip.visual, model.representation
    x = visual.stem(images)
    for index, block in enumerate(visual.blocks):
        if index == 1:
            x = torch.cat([x[:, :1], layer_map(rep.visual, 0, rep.rep).expand(len(x), -1, -1), x[:, 1:]], 1)
        elif index == 2:
            mixed = beta * layer_map(rep.visual, 1, rep.rep) + (1 - beta) * x[:, 1:1 + K]
            x = torch.cat([x[:, :1], mixed, x[:, 1 + K:]], 1)
        x = block(x)
    proj_rep = visual.proj + rep.proj_residual.a @ rep.proj_residual.b
    return visual.token_features(x[:, 0]), (visual.ln_post(x[:, 1:1 + K]) @ proj_rep).mean(1)


def hand_text(model, beta=BETA):
    """t [C, E]: insertion after BOT at block 1 (no positional embedding), blend at block 2, causal
    mask of the grown length, pooled at eot + K."""
    text, rep, ids = model.clip.text, model.representation, model.token_ids
    x = text.embed(ids) + text.positional_embedding
    for index, block in enumerate(text.blocks):
        if index == 1:
            x = torch.cat([x[:, :1], layer_map(rep.text, 0, rep.rep).expand(len(x), -1, -1), x[:, 1:]], 1)
        elif index == 2:
            mixed = beta * layer_map(rep.text, 1, rep.rep) + (1 - beta) * x[:, 1:1 + K]
            x = torch.cat([x[:, :1], mixed, x[:, 1 + K:]], 1)
        causal = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu_(1)
        x = block(x, attn_mask=causal)
    return text.project(x[torch.arange(len(ids)), text.eot_positions(ids) + K])


def test_learnable_shapes_and_initialisation(runner):
    model = build_model(runner, perturb=False)
    rep, clip = model.representation, model.clip
    assert rep.rep.shape == (K, REP_DIM) and abs(rep.rep.std().item() - 0.02) < 0.01
    for aligner, width in ((rep.visual, 64), (rep.text, 32)):
        assert aligner.weight.shape == (width, REP_DIM) and len(aligner) == 2
        assert torch.equal(aligner.bias[0], aligner.bias[1]) and aligner.bias[0].data_ptr() != aligner.bias[1].data_ptr()
        assert aligner.bias[0].abs().max() > 0 and aligner.bias[0].abs().max() <= REP_DIM ** -0.5
        a0, a1 = aligner.residuals[0].a, aligner.residuals[1].a
        assert a0.shape == (width, RANK) and aligner.residuals[0].b.shape == (RANK, REP_DIM)
        assert not torch.equal(a0, a1) and a0.abs().max() <= 1 / math.sqrt(RANK)  # Kaiming-uniform, a = √5
        assert all(torch.equal(r.b, torch.zeros_like(r.b)) for r in aligner.residuals)
        torch.testing.assert_close(layer_map(aligner, 0, rep.rep), layer_map(aligner, 1, rep.rep))  # equal at init
    assert rep.proj_residual.a.shape == (64, PROJ_RANK) and rep.proj_residual.b.shape == (PROJ_RANK, 32)
    assert torch.equal(rep.image_projection(clip.visual.proj), clip.visual.proj)  # proj_rep starts at CLIP's proj
    count = sum(p.numel() for p in rep.parameters())
    per_tower = sum(w * REP_DIM + 2 * (w + w * RANK + RANK * REP_DIM) for w in (64, 32))
    assert count == K * REP_DIM + per_tower + 64 * PROJ_RANK + PROJ_RANK * 32


def test_towers_equal_the_hand_computation(runner):
    model = build_model(runner)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f_cls, f_rep, reference = model.encode_image(images, frozen=True)
        hand_cls, hand_rep = hand_image(model, images)
        torch.testing.assert_close(f_cls, hand_cls, **TOL)
        torch.testing.assert_close(f_rep, hand_rep, **TOL)
        torch.testing.assert_close(reference, model.clip.encode_image_plain(images), **TOL)
        torch.testing.assert_close(model.compute_text_features(), hand_text(model), **TOL)


@pytest.mark.parametrize("wrong_beta", [1.0, 1 - BETA, 0.0])  # MMRL's replacement, the weights swapped, no re-injection
def test_a_wrong_blend_is_detected(runner, wrong_beta):
    model = build_model(runner)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f_cls, f_rep, _ = model.encode_image(images)
        wrong_cls, wrong_rep = hand_image(model, images, beta=wrong_beta)
        assert (f_cls - wrong_cls).abs().max() > 1e-3 and (f_rep - wrong_rep).abs().max() > 1e-3
        assert (model.compute_text_features() - hand_text(model, beta=wrong_beta)).abs().max() > 1e-3


def test_loss_terms_equal_an_independent_computation(runner):
    model = build_model(runner)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 2, 1, 2])
    total, fused, terms = model.loss(images, labels)
    with torch.no_grad():
        f_cls, f_rep = hand_image(model, images)
        t = hand_text(model)
        clip_image = model.clip.encode_image_plain(images)
        clip_text = model.clip.encode_text(model.token_ids)
    t_hat = F.normalize(t, dim=-1)
    z_c = 100 * F.normalize(f_cls, dim=-1) @ t_hat.t()
    z_r = 100 * F.normalize(f_rep, dim=-1) @ t_hat.t()
    reg_i = 1 - (F.normalize(f_cls, dim=-1) * F.normalize(clip_image, dim=-1)).sum(-1).mean()
    reg_t = 1 - (t_hat * F.normalize(clip_text, dim=-1)).sum(-1).mean()
    expected = 0.7 * F.cross_entropy(z_c, labels) + 0.3 * F.cross_entropy(z_r, labels) + 0.5 * (reg_i + reg_t)
    torch.testing.assert_close(total.detach(), expected, **TOL)
    torch.testing.assert_close(fused.detach(), 0.7 * z_c + 0.3 * z_r, **TOL)
    assert reg_i > 1e-4 and reg_t > 1e-4
    total.backward()
    for name, p in model.representation.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name
    assert all(p.grad is None for p in model.clip.parameters())


def test_inference_follows_the_role(runner):
    assert {role: INFERENCE_RULE.resolve("auto", role) for role in ("base", "new", "source", "target")} == {
        "base": "fusion", "new": "cls", "source": "fusion", "target": "cls"}
    images = torch.randn(2, 3, 32, 32)
    fusion, cls = build_model(runner, "fusion"), build_model(runner, "cls")
    assert_fusion_and_class_token_inference(fusion, cls, images, hand_image, hand_text, TOL)


def test_per_dataset_tables_follow_the_role_and_explicit_values_win():
    node = trainer_node("MMRLPP")
    assert len(BASE2NEW_SETTINGS) == 11 and len(TARGET_BETA) == 15
    assert node.BETA == node.REG_WEIGHT == "auto"
    assert dataset_rule("BETA", "base").resolve(node.BETA, "EuroSAT") == 0.2
    assert dataset_rule("BETA", "new").resolve(node.BETA, "EuroSAT") == 0.2
    assert dataset_rule("BETA", "target").resolve(node.BETA, "EuroSAT") == 0.3  # upstream's CD table
    assert dataset_rule("REG_WEIGHT", "source").resolve(node.REG_WEIGHT, "OxfordFlowers") == 7.0
    assert dataset_rule("BETA", "target").resolve(0.5, "EuroSAT") == 0.5
    with pytest.raises(ValueError, match="REG_WEIGHT is not read in the target evaluation scope"):
        dataset_rule("REG_WEIGHT", "target")
    source = resolved_node(node, "OxfordFlowers", "source")
    assert source.BETA == 0.4 and source.REG_WEIGHT == 7.0
    target = resolved_node(node, "ImageNetA", "target")
    assert target.BETA == 0.8 and target.REG_WEIGHT == "auto"  # a target evaluation does not train
    with pytest.raises(ConfigError, match=r"TARGET_BETA.*'SyntheticShapes'.*set TRAINER.MMRLPP.BETA"):
        check_mmrlpp_config(node, "SyntheticShapes", "target")
    with pytest.raises(ConfigError, match=r"BASE2NEW_SETTINGS.*'ImageNetA'.*set TRAINER.MMRLPP.BETA"):
        check_mmrlpp_config(node, "ImageNetA", "base")
    with pytest.raises(ConfigError, match=r"TRAINER.MMRLPP.BETA must be between 0.0 and 1.0, got 1.5"):
        check_mmrlpp_config(trainer_node("MMRLPP", BETA=1.5), "OxfordPets", "base")
    with pytest.raises(ConfigError, match="TRAINER.MMRLPP.REP_LAYERS must be consecutive"):
        check_mmrlpp_config(trainer_node("MMRLPP", REP_LAYERS=[6, 8]), "OxfordPets", "base")
    with pytest.raises(ConfigError, match="TRAINER.MMRLPP.RES_LORA_DIM"):
        check_mmrlpp_config(trainer_node("MMRLPP", RES_LORA_DIM=0), "OxfordPets", "base")


def pets_cfg(toy_world, tmp_path, config, *opts):  # noqa: F811
    """An official recipe on the toy OxfordPets and the tiny CLIP (3 image, 2 text blocks)."""
    return toy_world_cfg(toy_world, "MMRLpp", f"MMRLpp/{config}", tmp_path, "TRAINER.MMRLPP.PREC", "fp32",
                         "TRAINER.MMRLPP.REP_LAYERS", "[1, 2]", *opts)


@pytest.mark.parametrize("config, role, subsample, beta, reg_weight, inference", [
    ("vit_b16.yaml", "base", "base", 0.7, 0.01, "fusion"),  # OxfordPets: β 0.7, λ 0.01
    ("vit_b16.yaml", "new", "new", 0.7, 0.01, "cls"),
    ("vit_b16_cross_datasets.yaml", "target", "all", 0.6, 0.1, "cls"),  # OxfordPets as a CD target: β 0.6
    ("vit_b16_few_shot.yaml", "source", "all", 0.7, 0.01, "fusion"),
])
def test_trainer_resolves_the_settings_by_recipe_and_role(toy_world, tmp_path, config, role, subsample,  # noqa: F811
                                                          beta, reg_weight, inference):
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, config, "TEST.ROLE", role,
                                    "DATASET.SUBSAMPLE_CLASSES", subsample))
    model = trainer.model
    assert (model.representation.beta, model.reg_weight, model.inference) == (beta, reg_weight, inference)


def test_a_training_step_changes_only_the_representation(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "vit_b16.yaml", "DATASET.SUBSAMPLE_CLASSES", "base",
                                    "OPTIM.WARMUP_EPOCH", "0"))
    model = trainer.model
    optimizer = trainer._optims["representation"]
    assert type(optimizer).__name__ == "AdamW" and optimizer.param_groups[0]["weight_decay"] == 5e-4
    learned, kept, _ = one_step_changes_only_the_learnable(trainer)
    assert learned == {name for name, _ in model.named_parameters() if name.startswith("representation.")}
    assert "representation.proj_residual.b" in learned and "clip.visual.proj" in kept
    override = build_seeded(pets_cfg(toy_world, tmp_path / "x", "vit_b16.yaml", "TRAINER.MMRLPP.BETA", "0.25"))
    assert override.model.representation.beta == 0.25
