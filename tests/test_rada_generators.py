"""RAda's registered mask generators (paper Table 4 and supplement Table 10): start at M = 1,
match hand computations, compose into every RAda model, and are chosen by config."""
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import runner_and_tokenizer, trainer_node

from trainers.rada_adapter import RAdaAdapterCLIP
from trainers.rada_fft import RAdaFFTCLIP
from trainers.rada_prompt import RAdaPromptCLIP
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file
from vlprompt.methods.rada import RAdaCLIP, check_rada_node
from vlprompt.methods.rada_mask_generators import (
    MASK_GENERATOR_REGISTRY, MLPMaskGenerator, StackedRationalMaskGenerator, build_mask_generator,
)
from vlprompt.methods.rada_rational import RationalMaskGenerator
from vlprompt.methods.template_head import TemplateCLIP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALE = torch.tensor(14.3)

# Every variant of the paper's ablations: (GENERATOR.NAME, QUERIES, NUM_LAYERS).
VARIANTS = {
    "default": ("RationalMaskGenerator", ["image", "text", "rational"], 1),
    "query_r": ("RationalMaskGenerator", ["rational"], 1),
    "query_rf": ("RationalMaskGenerator", ["image", "rational"], 1),
    "query_rt": ("RationalMaskGenerator", ["text", "rational"], 1),
    "mlp": ("MLPMaskGenerator", ["image", "text", "rational"], 1),
    "layers2": ("StackedRationalMaskGenerator", ["image", "text", "rational"], 2),
    "layers3": ("StackedRationalMaskGenerator", ["image", "text", "rational"], 3),
}


def rada_node(variant, node_name="RADA", **changes):
    node = trainer_node(node_name, **changes)
    node.GENERATOR.NAME, node.GENERATOR.QUERIES, node.GENERATOR.NUM_LAYERS = VARIANTS[variant]
    return node


def normalised(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def perturb(module, std=0.3, seed=3):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(std * torch.randn(param.shape, generator=generator))


def linear(layer, x):
    return x @ layer.weight.T + layer.bias


# ------------------------------------------------------------------------ registry and M = 1

def test_registry_holds_the_three_generators():
    assert MASK_GENERATOR_REGISTRY.registered_names() == [
        "RationalMaskGenerator", "MLPMaskGenerator", "StackedRationalMaskGenerator",
    ]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_starts_at_an_all_ones_mask(variant):
    torch.manual_seed(0)
    generator = build_mask_generator(rada_node(variant), 32)
    mask = generator(normalised(3, 32), normalised(6, 32, seed=1), SCALE)
    assert mask.shape == (3, 6, 32)
    assert torch.equal(mask, torch.ones_like(mask))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_learns_a_mask_after_its_output_layer_moves(variant):
    generator = build_mask_generator(rada_node(variant), 32)
    perturb(generator)
    with torch.no_grad():
        mask = generator(normalised(3, 32), normalised(6, 32, seed=1), SCALE)
    assert (mask != 1).float().mean() > 0.3 and (mask >= 0).all()


def test_query_subsets_create_only_their_projections():
    names = {name.split(".")[0] for name in build_mask_generator(rada_node("query_rt"), 16).state_dict()}
    assert names == {"q_text", "q_rational", "key", "value", "out"}


# ------------------------------------------------------------------- hand-computed references

def one_head_attention(query, key, value):
    """softmax(Q K^T / sqrt(D)) V over the class axis for one image ([K, D] each; one head)."""
    return (query @ key.T / math.sqrt(query.shape[1])).softmax(dim=1) @ value


def hand_delta(generator, image, t, tau):
    """dM [K, D] of a one-head RationalMaskGenerator for one image [D], from plain torch ops."""
    rational = tau * image * t  # [K, D]
    key, value = linear(generator.key, rational), linear(generator.value, rational)
    inputs = {"image": math.sqrt(tau) * image.expand_as(t), "text": math.sqrt(tau) * t, "rational": rational}
    outputs = [
        one_head_attention(linear(getattr(generator, f"q_{name}"), inputs[name]), key, value)
        for name in generator.queries
    ]
    return linear(generator.out, sum(outputs) / len(outputs))


@pytest.mark.parametrize("queries", [("rational",), ("image", "rational"), ("text", "rational")])
def test_query_subset_equals_a_one_head_hand_computation(queries):
    torch.manual_seed(0)
    generator = RationalMaskGenerator(4, num_heads=1, queries=queries)
    perturb(generator)
    f, t, tau = normalised(2, 4), normalised(3, 4, seed=1), 9.0
    with torch.no_grad():
        expected = torch.stack([torch.relu(1 + hand_delta(generator, image, t, tau)) for image in f])
        got = generator(f, t, torch.tensor(tau))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_mlp_equals_a_hand_computation_per_class():
    torch.manual_seed(0)
    generator = MLPMaskGenerator(4)
    perturb(generator)
    f, t, tau = normalised(2, 4), normalised(3, 4, seed=1), 9.0
    expected = torch.stack([
        torch.stack([torch.relu(1 + linear(generator.out, torch.relu(linear(generator.hidden, tau * image * row))))
                     for row in t])
        for image in f
    ])
    with torch.no_grad():
        got = generator(f, t, torch.tensor(tau))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_mlp_treats_classes_independently_and_attention_does_not():
    """Changing class 2's feature leaves the MLP's mask rows of classes 0 and 1 unchanged (paper:
    the MLP "can only process different classes independently"); the attention's rows change."""
    f, t = normalised(2, 16), normalised(3, 16, seed=1)
    changed = t.clone()
    changed[2] = normalised(1, 16, seed=7)[0]
    for generator, independent in [(MLPMaskGenerator(16), True), (RationalMaskGenerator(16, num_heads=2), False)]:
        perturb(generator)
        with torch.no_grad():
            before, after = generator(f, t, SCALE), generator(f, changed, SCALE)
        assert torch.equal(before[:, :2], after[:, :2]) == independent
        assert not torch.equal(before[:, 2], after[:, 2])


def test_one_stacked_layer_is_the_default_generator():
    torch.manual_seed(0)
    default = RationalMaskGenerator(32, num_heads=4, attn_norm="global", temperature=0.5)
    torch.manual_seed(0)
    stacked = StackedRationalMaskGenerator(32, 1, num_heads=4, attn_norm="global", temperature=0.5)
    assert {f"first.{name}" for name in default.state_dict()} == set(stacked.state_dict())
    stacked_state = stacked.state_dict()
    assert all(torch.equal(value, stacked_state[f"first.{name}"]) for name, value in default.state_dict().items())
    perturb(default)
    stacked.first.load_state_dict(default.state_dict())
    f, t = normalised(5, 32), normalised(7, 32, seed=1)
    with torch.no_grad():
        assert torch.equal(stacked(f, t, SCALE), default(f, t, SCALE))


def test_two_stacked_layers_equal_a_one_head_hand_computation():
    """dM1 = Eq. 6; M1 = ReLU(1 + dM1); dM2 = dM1 + W_o softmax((W_q M1)(W_k tau R)^T / sqrt(D)) W_v tau R."""
    torch.manual_seed(0)
    stacked = StackedRationalMaskGenerator(4, 2, num_heads=1)
    perturb(stacked)
    f, t, tau = normalised(2, 4), normalised(3, 4, seed=1), 9.0
    layer = stacked.layers[0]
    expected = []
    with torch.no_grad():
        for image in f:
            rational = tau * image * t
            delta_1 = hand_delta(stacked.first, image, t, tau)
            attended = one_head_attention(linear(layer.query, torch.relu(1 + delta_1)), linear(layer.key, rational),
                                          linear(layer.value, rational))
            expected.append(torch.relu(1 + delta_1 + linear(layer.out, attended)))
        got = stacked(f, t, torch.tensor(tau))
        first_layer_only = stacked.first(f, t, torch.tensor(tau))
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, first_layer_only, atol=1e-3)


def test_stacked_chunks_do_not_change_the_mask():
    torch.manual_seed(0)
    whole = StackedRationalMaskGenerator(32, 3, num_heads=4)
    perturb(whole)
    chunked = StackedRationalMaskGenerator(32, 3, num_heads=4, chunk_size=2)
    chunked.load_state_dict(whole.state_dict())
    f, t = normalised(5, 32), normalised(7, 32, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(chunked(f, t, SCALE), whole(f, t, SCALE))


# ----------------------------------------------------------------------------- configuration

def test_unknown_generator_names_the_registered_ones():
    node = trainer_node("RADA")
    node.GENERATOR.NAME = "Transformer"
    with pytest.raises(ConfigError, match=r"TRAINER.RADA.GENERATOR.NAME 'Transformer'.*RationalMaskGenerator.*"
                                          r"MLPMaskGenerator.*StackedRationalMaskGenerator"):
        check_rada_node(node, "TRAINER.RADA")
    with pytest.raises(ConfigError, match="registered: "):
        build_mask_generator(node, 32)


@pytest.mark.parametrize("queries", [[], ["rational", "rational"], ["rational", "class"]])
def test_invalid_queries_are_config_errors(queries):
    node = trainer_node("RADAADAPTER")
    node.GENERATOR.QUERIES = queries
    with pytest.raises(ConfigError, match=r"TRAINER.RADAADAPTER.GENERATOR.QUERIES.*'image', 'text', 'rational'"):
        check_rada_node(node, "TRAINER.RADAADAPTER")


def test_zero_layers_is_a_config_error():
    node = trainer_node("RADATTT")
    node.GENERATOR.NUM_LAYERS = 0
    with pytest.raises(ConfigError, match="TRAINER.RADATTT.GENERATOR.NUM_LAYERS must be >= 1, got 0"):
        check_rada_node(node, "TRAINER.RADATTT")


def merged(name):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers/RAda", f"{name}.yaml"))
    return cfg


@pytest.mark.parametrize("base_name", ["synthetic", "vit_b16_base2new"])
@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"default"}))
def test_variant_configs_differ_from_their_base_only_in_the_generator(variant, base_name):
    cfg, base = merged(f"{base_name}_{variant}"), merged(base_name)
    assert (cfg.TRAINER.RADA.GENERATOR.NAME, list(cfg.TRAINER.RADA.GENERATOR.QUERIES),
            cfg.TRAINER.RADA.GENERATOR.NUM_LAYERS) == VARIANTS[variant]
    cfg.TRAINER.RADA.GENERATOR = base.TRAINER.RADA.GENERATOR.clone()
    assert cfg == base


# ------------------------------------------------------------------------------- composition

@pytest.mark.parametrize("variant", ["mlp", "query_r", "layers2"])
def test_every_rada_model_composes_a_variant_and_starts_at_zero_shot(variant, tiny_clip_files):
    clip, tokenizer = runner_and_tokenizer(tiny_clip_files)
    classes, templates = ["red star", "blue circle", "cat"], ["a photo of a {}."]
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected_type = MASK_GENERATOR_REGISTRY.get(VARIANTS[variant][0])
    models = [
        RAdaCLIP(clip, tokenizer, classes, templates, rada_node(variant)),
        RAdaCLIP(clip, tokenizer, classes, templates, rada_node(variant, "RADATTT")),  # RAdaTTT's model
        RAdaAdapterCLIP(clip, tokenizer, classes, templates, rada_node(variant, "RADAADAPTER")),
        RAdaFFTCLIP(clip, tokenizer, classes, templates, rada_node(variant, "RADAFFT")),
        RAdaPromptCLIP(clip, tokenizer, classes, rada_node(variant, "RADAPROMPT")),
    ]
    zero_shot = TemplateCLIP(clip, tokenizer, classes, templates).eval()
    for model in models:
        model.eval()
        assert type(model.mask_generator) is expected_type and model.rational.generator is model.mask_generator
        assert any(name.startswith("mask_generator.") for name in model.state_dict())
    with torch.no_grad():
        for model in models[:4]:
            logits = model(images)
            logits = logits[0] if isinstance(logits, tuple) else logits
            torch.testing.assert_close(logits, zero_shot(images), rtol=0, atol=1e-5)
        perturbed = copy.deepcopy(models[0])
        perturb(perturbed.mask_generator)
        assert perturbed.rational.generator is perturbed.mask_generator
        assert not torch.allclose(perturbed(images), zero_shot(images), atol=1e-3)
