"""MMA: parallel adapters s·U(S(D(LN_1 x))) beside blocks START..END of both towers, S shared,
gradients of the adapters scaled by 1/s (trainers/mma.py), and the runner's Plan.parallel hook."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, frozen, learnable, toy_pets_cfg, toy_world  # noqa: F401
from trainer_checks import assert_config_errors

import trainers.mma as mma
from trainers.mma import MMACLIP, GradientScale
from vlprompt.clip import CLIPRunner, Plan, Tokenizer, fill_template, load_clip
from vlprompt.config import extend_cfg, get_cfg_default

CLASSNAMES = ["abyssinian", "american_bulldog", "bengal"]
TOL = dict(rtol=1e-5, atol=1e-5)
SCALE = 0.001


def mma_node(**changes):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.MMA
    node.ADAPTER_START, node.ADAPTER_END = 2, 3  # tiny CLIP: 2 text blocks, 3 image blocks
    for name, value in changes.items():
        node[name] = value
    return node


@pytest.fixture(scope="module")
def runner(toy_world):  # noqa: F811
    _, config, weights = toy_world
    model, _ = load_clip(config, weights)
    return CLIPRunner(model), Tokenizer(config)


def build_model(runner, scale=SCALE, grow=200.0, **changes):
    """MMA on the tiny CLIP; the up-projections are multiplied by ``grow`` so that
    s·U(...) moves the features measurably (at init it is ~1e-3 of the hidden states)."""
    clip, tokenizer = runner
    torch.manual_seed(0)
    model = MMACLIP(clip, tokenizer, CLASSNAMES, mma_node(ADAPTER_SCALE=scale, **changes))
    with torch.no_grad():
        for tower in (model.adapter_learner.text, model.adapter_learner.visual):
            for adapter in tower.values():
                adapter.up.weight.mul_(grow)
                adapter.up.bias.normal_(std=0.1 * grow)
    return model


def hand_branch(model, tower, layer, h):
    """s·U(S(D(h))) with plain torch ops."""
    learner = model.adapter_learner
    adapter, shared = getattr(learner, tower)[str(layer)], learner.shared[str(layer)]
    y = F.relu(F.linear(h, adapter.down[0].weight, adapter.down[0].bias))
    y = F.relu(F.linear(y, shared[0].weight, shared[0].bias))
    return learner.scale * F.linear(y, adapter.up.weight, adapter.up.bias)


def hand_blocks(model, tower, x, mask=None):
    """Hidden states after each block, [x_1, ..., x_n], computed with open_clip's own block
    forward plus the hand-computed branch of the adapted (1-based) layers."""
    blocks = getattr(model.clip, "text" if tower == "text" else "visual").blocks
    adapted = getattr(model.adapter_learner, tower)
    outputs = []
    for index, block in enumerate(blocks):
        out = block(x, attn_mask=mask)
        if str(index + 1) in adapted:
            out = out + hand_branch(model, tower, index + 1, block.ln_1(x))
        outputs.append(out)
        x = out
    return outputs


def hand_features(model, images):
    """(image features [B, E], text features [C, E]) computed without the runner's block loop."""
    visual, text = model.clip.visual, model.clip.text
    image = visual.token_features(hand_blocks(model, "visual", visual.stem(images))[-1][:, 0])
    ids = model.token_ids
    x = text.embed(ids) + text.positional_embedding
    causal = text.base_mask(ids.shape[1], ids.device)
    pooled = hand_blocks(model, "text", x, causal)[-1][torch.arange(len(ids)), text.eot_positions(ids)]
    return image, text.project(pooled)


def test_adapters_sit_at_the_configured_layers_with_a_shared_middle(runner):
    model = build_model(runner)
    learner = model.adapter_learner
    assert list(learner.text) == ["2"] and list(learner.visual) == ["2", "3"] and list(learner.shared) == ["2", "3"]
    assert model.adapter_learner.plan("visual").parallel.keys() == {1, 2}  # 0-based blocks
    assert model.adapter_learner.plan("text").parallel.keys() == {1}
    down, up = learner.visual["3"].down[0], learner.visual["3"].up
    assert (down.in_features, down.out_features, up.in_features, up.out_features) == (64, 32, 32, 64)
    assert (learner.text["2"].down[0].in_features, learner.shared["2"][0].in_features) == (32, 32)
    assert isinstance(learner.shared["2"][1], torch.nn.ReLU) and isinstance(learner.text["2"].down[1], torch.nn.ReLU)
    fresh = MMACLIP(runner[0], runner[1], CLASSNAMES, mma_node())
    for linear in (m for m in fresh.adapter_learner.modules() if isinstance(m, torch.nn.Linear)):
        assert torch.count_nonzero(linear.bias) == 0
        std = (2.0 / linear.out_features) ** 0.5  # Kaiming normal, fan_out, ReLU gain
        assert abs(linear.weight.std().item() - std) < 0.35 * std
    sentences = [fill_template("a photo of a {}.", name) for name in CLASSNAMES]
    assert torch.equal(model.token_ids, runner[1](sentences))


def test_zero_up_projections_give_zero_shot_clip_exactly(runner):
    for model in (build_model(runner), build_model(runner, scale=SCALE)):
        with torch.no_grad():
            for tower in (model.adapter_learner.text, model.adapter_learner.visual):
                for adapter in tower.values():
                    adapter.up.weight.zero_()
                    adapter.up.bias.zero_()
        images = torch.randn(2, 3, 32, 32)
        clip = model.clip
        with torch.no_grad():
            image = F.normalize(clip.encode_image_plain(images), dim=-1)
            text = F.normalize(clip.encode_text(model.token_ids), dim=-1)
            expected = clip.logit_scale.exp() * image @ text.t()
            assert torch.equal(model(images), expected)


def test_runner_blocks_equal_the_hand_computed_blocks(runner):
    model = build_model(runner)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        image, text = hand_features(model, images)
        torch.testing.assert_close(model.clip.encode_image(images, model.adapter_learner.plan("visual")), image, **TOL)
        torch.testing.assert_close(model.compute_text_features(), text, **TOL)
        plain_image = model.clip.encode_image_plain(images)
        assert (image - plain_image).abs().max() > 1e-2  # the adapters are active


def test_a_perturbed_adapter_changes_only_its_block_and_later_ones(runner):
    model = build_model(runner)
    visual = model.clip.visual
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        stem = visual.stem(images)
        before = [visual.run_blocks(stem, 0, stop, model.adapter_learner.plan("visual")) for stop in (1, 2, 3)]
        text_before = model.compute_text_features()
        model.adapter_learner.visual["3"].up.bias.add_(1.0)  # image layer 3 = 0-based block 2
        after = [visual.run_blocks(stem, 0, stop, model.adapter_learner.plan("visual")) for stop in (1, 2, 3)]
        assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
        torch.testing.assert_close(after[2] - before[2], torch.full_like(before[2], SCALE), **TOL)
        assert torch.equal(model.compute_text_features(), text_before)
        image_before = model.clip.encode_image(images, model.adapter_learner.plan("visual"))
        model.adapter_learner.text["2"].up.bias.add_(torch.randn(32))  # not constant: LN would remove it
        assert (model.compute_text_features() - text_before).abs().max() > 1e-4
        assert torch.equal(model.clip.encode_image(images, model.adapter_learner.plan("visual")), image_before)


def test_parallel_branch_follows_the_computed_rows(runner):
    """The last block computes the class token only: the branch sees ln_1 of that row."""
    model = build_model(runner)
    visual = model.clip.visual
    images = torch.randn(2, 3, 32, 32)
    seen = []
    plan = model.adapter_learner.plan("visual")
    last = plan.parallel[2]
    plan = Plan(parallel={1: plan.parallel[1], 2: lambda h: seen.append(h.shape) or last(h)})
    with torch.no_grad():
        rows_only = visual(images, plan, rows=[0])
        full = visual(images, plan)
    assert seen == [(2, 1, 64), (2, 17, 64)]
    torch.testing.assert_close(rows_only.features, full.features, **TOL)


def test_the_middle_layer_is_shared_by_both_towers(runner):
    model = build_model(runner)
    shared = model.adapter_learner.shared["2"][0].weight
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])
    image_features = model.clip.encode_image(images, model.adapter_learner.plan("visual"))
    text_features = model.compute_text_features()
    (grad_image,) = torch.autograd.grad(image_features.square().sum(), shared)
    (grad_text,) = torch.autograd.grad(text_features.square().sum(), shared)
    assert grad_image.abs().max() > 0 and grad_text.abs().max() > 0
    model.zero_grad()
    model.loss(images, labels)[0].backward()
    assert shared.grad.abs().max() > 0
    assert model.adapter_learner.shared["3"][0].weight.grad.abs().max() > 0  # image layer 3 only


def test_gradient_scale_layer_is_identity_forward_and_scales_backward():
    x = torch.randn(3, 4, requires_grad=True)
    y = GradientScale.apply(x, 0.25)
    assert torch.equal(y, x)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(grad, torch.full_like(x, 0.25))


def test_adapter_gradients_are_one_over_s_times_plain_autograd(runner, monkeypatch):
    """In g_{1/s}(s·U(S(D(g_s(h))))) every adapter parameter lies between the two scale layers:
    its gradient is (1/s)·(plain autograd's); the gradient reaching the hidden states is
    plain autograd's (factor 1/s · s = 1), so earlier adapters see the same 1/s factor."""
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])

    def gradients(model):
        model.zero_grad()
        model.loss(images, labels)[0].backward()
        return {name: p.grad.clone() for name, p in model.adapter_learner.named_parameters()}

    scaled = gradients(build_model(runner))
    monkeypatch.setattr(mma, "gradient_scale", lambda x, scale: x)
    plain = gradients(build_model(runner))
    assert len(scaled) == 3 * 4 + 2 * 2  # three bottlenecks (4 tensors) and two shared layers
    for name, grad in scaled.items():
        assert plain[name].abs().max() > 0, name
        expected = plain[name] / SCALE  # float32 rounding: tolerance relative to the tensor's largest entry
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())


def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    data, config, weights = toy_world
    return toy_pets_cfg("MMA", "MMA/vit_b16_ep5.yaml", data, tmp_path, (config, weights),
                        "INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "4",
                        "TRAINER.MMA.PREC", "fp32", "TRAINER.MMA.ADAPTER_START", "2",
                        "TRAINER.MMA.ADAPTER_END", "3", *opts)


def test_a_training_step_changes_only_the_adapters(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base"))
    model = trainer.model
    before_learned, before_frozen = learnable(model), frozen(model)
    assert sorted(before_learned) == sorted([
        f"adapter_learner.{tower}.{layer}.{part}"
        for tower, layers in (("text", "2"), ("visual", "23"))
        for layer in layers
        for part in ("down.0.weight", "down.0.bias", "up.weight", "up.bias")
    ] + [f"adapter_learner.shared.{layer}.0.{p}" for layer in "23" for p in ("weight", "bias")])
    trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
    trainer.forward_backward(next(iter(trainer.train_loader_x)))
    for name in ("adapter_learner.visual.3.up.bias", "adapter_learner.text.2.up.bias", "adapter_learner.shared.2.0.weight"):
        assert not torch.equal(learnable(model)[name], before_learned[name]), name
    for name, value in frozen(model).items():
        assert torch.equal(value, before_frozen[name]), name


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    cases = [
        (("TRAINER.MMA.ADAPTER_START", "0"), r"ADAPTER_START must be at least 1"),
        (("TRAINER.MMA.ADAPTER_END", "1"), r"ADAPTER_END must be at least 2"),
        (("TRAINER.MMA.ADAPTER_START", "3"), r"both towers.*3 image and 2 text blocks.*ADAPTER_START <= 2"),
        (("TRAINER.MMA.ADAPTER_END", "4"), r"ADAPTER_END <= 3"),
        (("TRAINER.MMA.ADAPTER_SCALE", "0.0"), "ADAPTER_SCALE must be > 0"),
        (("TRAINER.MMA.PREC", "fp8"), "TRAINER.MMA.PREC"),
    ]
    assert_config_errors(lambda *opts: pets_cfg(toy_world, tmp_path, *opts), cases)
