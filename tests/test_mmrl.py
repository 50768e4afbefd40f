"""MMRL: representation tokens P^l(R) inserted after CLS/BOT at the first representation layer
and replaced at the later ones in both towers, f_rep through proj_rep, the loss and the
role-dependent inference (trainers/mmrl.py), checked against a hand computation with
open_clip's own blocks."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import (  # noqa: F401
    build_seeded, deeper_runner, runner_and_tokenizer, toy_world, toy_world_cfg, trainer_node,
)
from trainer_checks import assert_fusion_and_class_token_inference, one_step_changes_only_the_learnable

from trainers.mmrl import DATASET_SETTINGS, INFERENCE_RULE, check_mmrl_config, dataset_settings
from vlprompt.clip import fill_template
from vlprompt.config import ConfigError
from vlprompt.methods.representation_tokens import MMRLCLIP

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TEMPLATE = "a photo of a {}, a type of pet."
K = 3
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return deeper_runner(tmp_path_factory.mktemp("mmrl"), "tiny-clip-mmrl")  # representation layers 2..3


def mmrl_node(**changes):
    settings = {"N_REP_TOKENS": K, "REP_LAYERS": [2, 3], "REP_DIM": 16, "REG_WEIGHT": 0.5}
    return trainer_node("MMRL", **{**settings, **changes})


def build_model(runner, inference="fusion", perturb=True, **changes):
    """MMRL on the tiny CLIP; with ``perturb`` R and the maps are 10x their init scale, so that
    a misplaced token moves the outputs."""
    clip, tokenizer = runner
    torch.manual_seed(0)
    node = mmrl_node(**changes)
    model = MMRLCLIP(clip, tokenizer, CLASSNAMES, TEMPLATE, node, node.REP_DIM, node.REG_WEIGHT, inference)
    if perturb:
        with torch.no_grad():
            for p in model.representation.parameters():
                p.mul_(10.0)
    return model


def hand_image(model, images, insert_at=1):
    """(f_cls, f_rep) with open_clip's blocks and plain concatenation."""
    visual, rep = model.clip.visual, model.representation
    x = visual.stem(images)
    for index, block in enumerate(visual.blocks):
        if index == 1:
            tokens = rep.visual[0](rep.rep).expand(len(x), -1, -1)
            x = torch.cat([x[:, :insert_at], tokens, x[:, insert_at:]], 1)
        elif index == 2:
            tokens = rep.visual[1](rep.rep).expand(len(x), -1, -1)
            x = torch.cat([x[:, :1], tokens, x[:, 1 + K:]], 1)
        x = block(x)
    f_rep = (visual.ln_post(x[:, 1:1 + K]) @ rep.proj_rep).mean(1)
    return visual.token_features(x[:, 0]), f_rep


def hand_text(model, shift=K):
    """t [C, E]: embeddings + positional embedding, insertion after BOT at block 1 (no positional
    embedding), replacement at block 2, causal mask of the grown length, pooled at eot + ``shift``."""
    text, rep, ids = model.clip.text, model.representation, model.token_ids
    x = text.embed(ids) + text.positional_embedding
    for index, block in enumerate(text.blocks):
        if index == 1:
            x = torch.cat([x[:, :1], rep.text[0](rep.rep).expand(len(x), -1, -1), x[:, 1:]], 1)
        elif index == 2:
            x = torch.cat([x[:, :1], rep.text[1](rep.rep).expand(len(x), -1, -1), x[:, 1 + K:]], 1)
        causal = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu_(1)
        x = block(x, attn_mask=causal)
    return text.project(x[torch.arange(len(ids)), text.eot_positions(ids) + shift])


def test_learnable_shapes_and_initialisation(runner):
    model = build_model(runner, perturb=False, REP_DIM=256)
    rep, clip = model.representation, model.clip
    assert rep.rep.shape == (K, 256) and abs(rep.rep.std().item() - 0.02) < 0.004
    assert [tuple(m.weight.shape) for m in rep.visual] == [(64, 256)] * 2
    assert [tuple(m.weight.shape) for m in rep.text] == [(32, 256)] * 2
    for maps in (rep.visual, rep.text):  # deep copies of one random Linear: equal values, separate tensors
        assert torch.equal(maps[0].weight, maps[1].weight) and torch.equal(maps[0].bias, maps[1].bias)
        assert maps[0].weight.data_ptr() != maps[1].weight.data_ptr()
        assert maps[0].bias.abs().max() > 0
    assert rep.proj_rep.shape == (64, 32) and abs(rep.proj_rep.std().item() - 64 ** -0.5) < 0.2 * 64 ** -0.5
    assert not torch.allclose(rep.proj_rep, clip.visual.proj)
    assert torch.equal(model.token_ids, runner[1]([fill_template(TEMPLATE, n) for n in CLASSNAMES]))


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


def test_misplaced_tokens_are_detected(runner):
    model = build_model(runner)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f_cls, f_rep, _ = model.encode_image(images)
        wrong_cls, wrong_rep = hand_image(model, images, insert_at=2)
        assert (f_cls - wrong_cls).abs().max() > 1e-3 and (f_rep - wrong_rep).abs().max() > 1e-3
        assert (model.compute_text_features() - hand_text(model, shift=0)).abs().max() > 1e-3


def test_text_grows_by_k_and_the_pooled_position_moves(runner):
    model = build_model(runner)
    text, ids = model.clip.text, model.token_ids
    with torch.no_grad():
        out = text(ids, model.representation.plan("text", model.first_block, model.text_at), all_tokens=True)
    eot = text.eot_positions(ids)
    assert torch.equal(out.eot, eot + K)
    assert out.tokens.shape[1] == int(eot.max()) + 1 + K




def test_loss_terms_equal_an_independent_computation(runner):
    model = build_model(runner)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 2, 1, 2])
    total, fused, terms = model.loss(images, labels)
    with torch.no_grad():
        f_cls, f_rep = hand_image(model, images)
        t = hand_text(model)
        clip_image = model.clip.encode_image_plain(images)
        clip_text = model.clip.encode_text(model.token_ids)
    t_hat = t / t.norm(dim=-1, keepdim=True)
    z_c = 100 * (f_cls / f_cls.norm(dim=-1, keepdim=True)) @ t_hat.t()
    z_r = 100 * (f_rep / f_rep.norm(dim=-1, keepdim=True)) @ t_hat.t()
    ce_c, ce_r = F.cross_entropy(z_c, labels), F.cross_entropy(z_r, labels)
    reg_i = 1 - (F.normalize(f_cls, dim=-1) * F.normalize(clip_image, dim=-1)).sum(-1).mean()
    reg_t = 1 - (F.normalize(t, dim=-1) * F.normalize(clip_text, dim=-1)).sum(-1).mean()
    expected = 0.7 * ce_c + 0.3 * ce_r + 0.5 * reg_i + 0.5 * reg_t
    torch.testing.assert_close(total.detach(), expected, **TOL)
    torch.testing.assert_close(fused.detach(), 0.7 * z_c + 0.3 * z_r, **TOL)
    for name, value in {"ce_cls": ce_c, "ce_rep": ce_r, "reg_image": reg_i, "reg_text": reg_t}.items():
        torch.testing.assert_close(terms[name], value, **TOL)
    assert reg_i > 1e-4 and reg_t > 1e-4
    total.backward()
    rep = model.representation
    for p in [rep.rep, rep.proj_rep, *rep.visual.parameters(), *rep.text.parameters()]:
        assert p.grad is not None and p.grad.abs().max() > 0
    assert all(p.grad is None for p in model.clip.parameters())


def test_inference_follows_the_role(runner):
    assert {role: INFERENCE_RULE.resolve("auto", role) for role in ("base", "new", "source", "target")} == {
        "base": "fusion", "new": "cls", "source": "fusion", "target": "cls"}
    images = torch.randn(2, 3, 32, 32)
    fusion, cls = build_model(runner, "fusion"), build_model(runner, "cls")
    assert_fusion_and_class_token_inference(fusion, cls, images, hand_image, hand_text, TOL)


def test_per_dataset_settings_and_config_errors(runner):
    node = trainer_node("MMRL")
    assert node.REP_DIM == node.REG_WEIGHT == "auto"
    assert dataset_settings(node, "EuroSAT") == (2048, 0.01)
    assert dataset_settings(node, "StanfordCars") == (512, 7.0) and len(DATASET_SETTINGS) == 11
    assert dataset_settings(trainer_node("MMRL", REG_WEIGHT=2.0), "EuroSAT") == (2048, 2.0)  # explicit wins
    with pytest.raises(ConfigError, match=r"TRAINER.MMRL.REG_WEIGHT is 'auto'.*DATASET_SETTINGS.*'SyntheticShapes'.*"
                                          r"set TRAINER.MMRL.REG_WEIGHT"):
        check_mmrl_config(node, "SyntheticShapes")
    with pytest.raises(ConfigError, match=r"TRAINER.MMRL.REP_DIM is 'auto'.*DATASET_SETTINGS.*'SyntheticShapes'.*"
                                          r"set TRAINER.MMRL.REP_DIM"):
        check_mmrl_config(trainer_node("MMRL", REG_WEIGHT=1.0), "SyntheticShapes")
    with pytest.raises(ConfigError, match=r"TRAINER.MMRL.REG_WEIGHT must be at least 0.0, got -1.0"):
        check_mmrl_config(trainer_node("MMRL", REG_WEIGHT=-1.0), "EuroSAT")
    with pytest.raises(ConfigError, match=r"TRAINER.MMRL.REP_DIM must be 'auto' .* or a number, got 'wide'"):
        check_mmrl_config(trainer_node("MMRL", REP_DIM="wide"), "EuroSAT")
    with pytest.raises(ConfigError, match="REP_LAYERS must be consecutive"):
        check_mmrl_config(mmrl_node(REP_LAYERS=[2, 4]), "OxfordPets")
    with pytest.raises(ConfigError, match="TRAINER.MMRL.INFERENCE"):
        check_mmrl_config(mmrl_node(INFERENCE="rep"), "OxfordPets")
    with pytest.raises(ConfigError, match=r"REP_LAYERS \[3, 4\] must lie within both towers \(1..3"):
        build_model(runner, REP_LAYERS=[3, 4])


def test_original_tokens_are_frozen_clip_before_the_first_representation_layer(runner):
    """Both plans act from block 2 (1-based) on; the image states entering it are frozen CLIP's,
    so the class feature equals CLIP's when the representation tokens are dropped again."""
    model = build_model(runner)
    for tower in ("visual", "text"):
        plan = model.representation.plan(tower, model.first_block, 1)
        assert plan.first_layer(4) == 1 and sorted(plan.layers) == [1, 2]
    visual, images = model.clip.visual, torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(visual.run_prefix(images, 1), visual.blocks[0](visual.stem(images)), **TOL)
        f_cls, _, _ = model.encode_image(images)
        assert (f_cls - model.clip.encode_image_plain(images)).abs().max() > 1e-3  # the tokens are attended


def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    """The official recipe (vit_b16.yaml) on the toy OxfordPets and the tiny CLIP (3 image, 2 text blocks)."""
    return toy_world_cfg(toy_world, "MMRL", "MMRL/vit_b16.yaml", tmp_path, "TRAINER.MMRL.PREC", "fp32",
                         "TRAINER.MMRL.REP_LAYERS", "[1, 2]", *opts)


@pytest.mark.parametrize("role, subsample, inference, expected", [
    ("base", "base", "auto", "fusion"),
    ("source", "all", "auto", "fusion"),
    ("new", "new", "auto", "cls"),
    ("target", "all", "auto", "cls"),
    ("new", "new", "fusion", "fusion"),  # explicit override
])
def test_trainer_inference_follows_the_evaluation_role(toy_world, tmp_path, role, subsample, inference,  # noqa: F811
                                                       expected):
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "TEST.ROLE", role, "DATASET.SUBSAMPLE_CLASSES", subsample,
                                    "TRAINER.MMRL.INFERENCE", inference))
    assert trainer.model.inference == expected


def test_trainer_reads_the_dataset_table_and_trains_only_the_representation(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base",
                                    "OPTIM.WARMUP_EPOCH", "0"))
    model = trainer.model
    assert model.reg_weight == 0.2 and model.representation.rep.shape == (5, 512)  # OxfordPets: λ 0.2, d_r 512
    optimizer = trainer._optims["representation"]
    assert type(optimizer).__name__ == "AdamW" and optimizer.param_groups[0]["weight_decay"] == 5e-4
    learned, _, _ = one_step_changes_only_the_learnable(trainer)
    assert learned == {name for name, _ in model.named_parameters() if name.startswith("representation.")}
    override = build_seeded(pets_cfg(toy_world, tmp_path / "x", "TRAINER.MMRL.REG_WEIGHT", "3.0"))
    assert override.model.reg_weight == 3.0


def test_a_sentence_filling_the_context_grows_past_it_without_truncation(runner):
    """The tiny CLIP's context is 32 tokens: a 32-token sentence has its end-of-text token at 31,
    and at 31 + K after the insertion (35 positions, beyond the positional embedding and the
    model's own causal mask); the features equal the hand computation."""
    clip, tokenizer = runner
    name = " ".join(["x"] * 20)  # "a photo of a x ... x, a type of pet.": 30 tokens + BOT + EOT
    torch.manual_seed(0)
    node = mmrl_node()
    model = MMRLCLIP(clip, tokenizer, [name], TEMPLATE, node, node.REP_DIM, node.REG_WEIGHT, "fusion")
    assert int(clip.text.eot_positions(model.token_ids)) == 31
    with torch.no_grad():
        out = clip.text(model.token_ids, model.representation.plan("text", model.first_block, model.text_at), all_tokens=True)
        assert int(out.eot) == 31 + K and out.tokens.shape[1] == 32 + K
        torch.testing.assert_close(model.compute_text_features(), hand_text(model), **TOL)
