"""ProVP: prompts P_0 inserted after CLS at block 0 (only when N > 4), the α re-mix of positions
1..N at the later blocks, CE + λ·InfoNCE against frozen CLIP's image features, the fixed text
classifier (trainers/provp.py), checked against a hand computation with open_clip's own blocks."""
import math

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import (  # noqa: F401
    build_seeded, tiny_runner, toy_world, toy_world_cfg, trainer_node,
)
from trainer_checks import assert_config_errors, one_step_changes_only_the_learnable, saved_keys

from trainers.provp import ProVPCLIP, provp_template, uniform_bound
from vlprompt.clip import fill_template
from vlprompt.methods.prograd_templates import PROGRAD_TEMPLATES

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TEMPLATE = "a type of pet, a photo of a {}."
N = 5
TOL = dict(rtol=1e-5, atol=1e-5)


def provp_node(**changes):
    settings = {"N_PROMPTS": N, "PROMPT_DEPTH": 3}
    return trainer_node("PROVP", **{**settings, **changes})


def build_model(runner, perturb=True, **changes):
    """ProVP on the tiny CLIP (3 image blocks of width 64); with ``perturb`` P is 10x its init
    scale, so that a misplaced or mis-mixed prompt moves the features."""
    clip, tokenizer = runner
    torch.manual_seed(0)
    model = ProVPCLIP(clip, tokenizer, CLASSNAMES, TEMPLATE, provp_node(**changes))
    if perturb:
        with torch.no_grad():
            model.prompt_learner.prompt_embeddings.mul_(10.0)
    return model


def hand_features(model, images, insert=True, insert_at=1, alpha=None):
    """Normalised image features [B, E] from open_clip's blocks: P_0 concatenated after the class
    token at the input of block 0 (after ln_pre), then x[:, 1:N+1] = α·x[:, 1:N+1] + (1−α)·P_l
    in place at the input of every later prompted block, the class token pooled."""
    visual, prompts = model.clip.visual, model.prompt_learner.prompt_embeddings
    alpha = model.prompt_learner.alpha if alpha is None else alpha
    n = prompts.shape[1]
    x = visual.stem(images)
    for index, block in enumerate(visual.blocks):
        if index == 0 and insert:
            x = torch.cat([x[:, :insert_at], prompts[0].expand(len(x), -1, -1), x[:, insert_at:]], dim=1)
        elif 0 < index < prompts.shape[0]:
            x = x.clone()
            x[:, 1:n + 1] = x[:, 1:n + 1] * alpha + prompts[index] * (1 - alpha)
        x = block(x)
    return F.normalize(visual.token_features(x[:, 0]), dim=-1)


def test_prompts_are_uniform_within_the_xavier_bound_of_patch_14(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, perturb=False)
    prompts = model.prompt_learner.prompt_embeddings
    bound = math.sqrt(6.0 / (3 * 14 * 14 + 64))
    assert uniform_bound(14, 64) == pytest.approx(bound)
    assert prompts.shape == (3, N, 64) and prompts.requires_grad
    assert prompts.abs().max() <= bound and prompts.abs().max() > 0.95 * bound
    assert abs(prompts.std().item() - bound / math.sqrt(3)) < 0.1 * bound  # uniform, not normal
    wider = build_model(tiny_runner, perturb=False, INIT_PATCH_SIZE=4).prompt_learner.prompt_embeddings
    assert wider.abs().max() > 0.95 * uniform_bound(4, 64) > bound


def test_image_features_equal_the_hand_computation(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), hand_features(model, images), **TOL)
        plan = model.prompt_learner.plan()
    assert sorted(plan.layers) == [0, 1, 2] and not plan.embed  # inserted after ln_pre, not before


def test_misplaced_or_mis_mixed_prompts_are_detected(tiny_runner):  # noqa: F811
    """α = 0.01 keeps only 1 % of the previous output, so the mixing weights are checked at α = 0.3:
    swapped weights (0.7) or a plain replacement (0) move the features."""
    images = torch.randn(2, 3, 32, 32)
    model, mixed = build_model(tiny_runner), build_model(tiny_runner, ALPHA=0.3)
    with torch.no_grad():
        ours = model.encode_image(images)
        assert (ours - hand_features(model, images, insert_at=2)).abs().max() > 1e-3
        assert (ours - hand_features(model, images, insert=False)).abs().max() > 1e-3
        ours = mixed.encode_image(images)
        torch.testing.assert_close(ours, hand_features(mixed, images), **TOL)
        for alpha in (0.7, 0.0):
            assert (ours - hand_features(mixed, images, alpha=alpha)).abs().max() > 1e-3


def test_four_tokens_or_fewer_are_not_inserted_and_the_re_mix_hits_patch_tokens(tiny_runner):  # noqa: F811
    """Upstream's rule: with N <= 4 block 0 inserts nothing, blocks >= 1 re-mix the first N patch
    tokens, and P_0 is unused (no gradient)."""
    model = build_model(tiny_runner, N_PROMPTS=4)
    images = torch.randn(2, 3, 32, 32)
    assert sorted(model.prompt_learner.plan().layers) == [1, 2]
    features = model.encode_image(images)
    torch.testing.assert_close(features, hand_features(model, images, insert=False), **TOL)
    features.sum().backward()
    grad = model.prompt_learner.prompt_embeddings.grad
    assert grad[0].abs().max() == 0 and grad[1:].abs().min(dim=-1).values.min() > 0


def test_the_text_classifier_is_frozen_clip_of_the_template(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    clip, tokenizer = tiny_runner
    with torch.no_grad():
        expected = clip.encode_text(tokenizer([fill_template(TEMPLATE, name) for name in CLASSNAMES]))
    torch.testing.assert_close(model.class_features, expected, **TOL)
    assert set(model.state_dict()) - {k for k in model.state_dict() if k.startswith("clip.")} == {
        "prompt_learner.prompt_embeddings"}  # the classifier is rebuilt, never saved


def test_templates_are_prograds_table_else_the_datasets_own():
    class Synthetic:
        template = "a rendering of a {}."

    assert provp_template("OxfordPets", Synthetic()) == "a type of pet, a photo of a {}." == PROGRAD_TEMPLATES["OxfordPets"]
    assert provp_template("DescribableTextures", Synthetic()) == "a texture of {}."
    assert provp_template("SyntheticShapes", Synthetic()) == "a rendering of a {}."


def test_loss_is_cross_entropy_plus_infonce_against_frozen_image_features(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, REF_WEIGHT=0.5)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 2, 1, 2])
    total, logits, terms = model.loss(images, labels)
    with torch.no_grad():
        f_p = hand_features(model, images)
        f_clip = F.normalize(model.clip.encode_image_plain(images), dim=-1)
        t_hat = F.normalize(model.class_features, dim=-1)
    expected_logits = model.clip.logit_scale.exp() * f_p @ t_hat.t()
    xe = F.cross_entropy(expected_logits, labels)
    similarity = f_p @ f_clip.t()  # no temperature
    ref = -torch.log_softmax(similarity, dim=1).diagonal().mean()
    torch.testing.assert_close(logits.detach(), expected_logits, **TOL)
    torch.testing.assert_close(terms["xe_loss"], xe, **TOL)
    torch.testing.assert_close(terms["ref_loss"], ref, **TOL)
    torch.testing.assert_close(total.detach(), xe + 0.5 * ref, **TOL)
    assert ref > 1.0  # without a temperature the cosines stay in [-1, 1]: far from one-hot
    total.backward()
    assert model.prompt_learner.prompt_embeddings.grad.abs().max() > 0
    assert all(p.grad is None for p in model.clip.parameters())


def test_zero_weight_is_provp_without_re_formation(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, REF_WEIGHT=0.0)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 2, 1, 2])
    total, logits, terms = model.loss(images, labels)
    assert set(terms) == {"xe_loss"}
    torch.testing.assert_close(total, F.cross_entropy(logits, labels))


def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    """The official recipe (vit_b16_b2n_ep100.yaml) on the toy OxfordPets and the tiny CLIP (3 image blocks)."""
    return toy_world_cfg(toy_world, "ProVP", "ProVP/vit_b16_b2n_ep100.yaml", tmp_path,
                         "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "TRAINER.PROVP.PREC", "fp32",
                         "TRAINER.PROVP.PROMPT_DEPTH", "3", *opts)


def test_a_training_step_changes_only_the_prompts_with_the_official_optimiser(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base", "OPTIM.WARMUP_EPOCH", "0"))
    model = trainer.model
    optimizer = trainer._optims["prompt_learner"]
    assert type(optimizer).__name__ == "SGD"
    assert optimizer.param_groups[0]["initial_lr"] == 0.1 and optimizer.param_groups[0]["weight_decay"] == 1e-3
    assert model.prompt_learner.prompt_embeddings.shape == (3, 16, 64) and model.ref_weight == 1.0
    learned, _, summary = one_step_changes_only_the_learnable(trainer)
    assert learned == {"prompt_learner.prompt_embeddings"}
    assert {"xe_loss", "ref_loss"} <= set(summary)


@pytest.mark.parametrize("role, subsample", [("new", "new"), ("target", "all")])
def test_new_classes_use_the_trained_prompts_and_their_own_classifier(toy_world, tmp_path, role, subsample):  # noqa: F811
    """The checkpoint holds P only; evaluation on other classes is the same forward (no role rule)."""
    trained = build_seeded(pets_cfg(toy_world, tmp_path / "base", "DATASET.SUBSAMPLE_CLASSES", "base"))
    with torch.no_grad():
        trained.model.prompt_learner.prompt_embeddings.mul_(10.0)
    # upstream's name: its checkpoints load as they are
    assert saved_keys(trained, tmp_path / "run", "prompt_learner") == {"prompt_embeddings"}
    other = build_seeded(pets_cfg(toy_world, tmp_path / role, "DATASET.SUBSAMPLE_CLASSES", subsample, "TEST.ROLE", role))
    other.load_model(str(tmp_path / "run"), epoch=1)
    model = other.model
    torch.testing.assert_close(model.prompt_learner.prompt_embeddings, trained.model.prompt_learner.prompt_embeddings)
    assert other.classnames != trained.classnames and len(model.class_features) == len(other.classnames)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.clip.logit_scale.exp() * hand_features(model, images) @ F.normalize(model.class_features, dim=-1).t()
        torch.testing.assert_close(model(images), expected, **TOL)


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    cases = [
        (("TRAINER.PROVP.PROMPT_DEPTH", "4"), r"TRAINER\.PROVP\.PROMPT_DEPTH must be between 1 and 3.*image tower"),
        (("TRAINER.PROVP.N_PROMPTS", "0"), r"TRAINER\.PROVP\.N_PROMPTS must be at least 1"),
        (("TRAINER.PROVP.ALPHA", "1.5"), r"TRAINER\.PROVP\.ALPHA must be between 0.0 and 1.0"),
        (("TRAINER.PROVP.INIT_PATCH_SIZE", "0"), r"TRAINER\.PROVP\.INIT_PATCH_SIZE must be at least 1"),
        (("TRAINER.PROVP.REF_WEIGHT", "-1.0"), r"TRAINER\.PROVP\.REF_WEIGHT must be at least 0.0"),
        (("TRAINER.PROVP.PREC", "fp8"), "TRAINER.PROVP.PREC"),
    ]
    assert_config_errors(lambda *opts: pets_cfg(toy_world, tmp_path, *opts), cases)
