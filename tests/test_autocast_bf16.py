"""DeAR and RAda under CPU bfloat16 autocast, built by their trainers on the tiny random CLIP.

On CPU the engine runs every PREC in fp32 (vlprompt/engine/amp.py: autocast only on CUDA),
so these tests enter ``torch.autocast("cpu", dtype=torch.bfloat16)`` themselves around the
trainer's own training step and the model's forward: the numerics of bf16 autocast (matrix
products in bf16, fp32 master weights) are what CUDA bf16 runs as well.
"""
import math

import pytest
import torch
from baseline_setup import build_seeded, toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.clip.head_roles import parse_role_map
from vlprompt.engine.amp import MixedPrecision
from vlprompt.testing import write_oxford_pets_tree

DEAR_ROLES = {
    "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
    "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
}
# bf16 keeps 8 significant bits: unit roundoff 2^-8 = 0.0039. Measured on the tiny CLIP
# (tau = 14.4; 3 batches of 8 random images, seeds 1-3, 3 classes), the largest
# |bf16 logit - fp32 logit| / tau is 0.0026-0.0030 for DeAR and 0.0030-0.0041 for RAda,
# about one bf16 roundoff of a cosine (DeAR's logits are themselves bf16 tensors). The
# tolerance, 0.02 * tau (5 roundoffs), leaves a margin of about 5 over the largest.
LOGIT_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def toy(tiny_clip_files, tmp_path_factory):
    """(data root, role-map file for DeAR, tiny CLIP files)."""
    base = tmp_path_factory.mktemp("bf16")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=1)
    role_map = str(base / "roles.yaml")
    parse_role_map(DEAR_ROLES).save(role_map)
    return str(base / "data"), role_map, tiny_clip_files


def build(toy, trainer, tmp_path):
    """The trainer on the toy OxfordPets (3 base classes, 4 shots); image features are not
    cached, so RAda's image tower runs under autocast too."""
    root, role_map, clip_files = toy
    opts = ["INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", "DATASET.NUM_SHOTS", "4",
            "DATASET.SUBSAMPLE_CLASSES", "base", "DATALOADER.TRAIN_X.BATCH_SIZE", "4"]
    if trainer == "DeAR":
        config = "DeAR/vit_b16_base2new.yaml"
        opts += ["TRAINER.DEAR.ROLE_MAP", role_map, "TRAINER.DEAR.INJECT_LAYER", "2",
                 "TRAINER.DEAR.ATTRIBUTES", "['color', 'shape']"]
    else:
        config = "RAda/toy.yaml"
        opts += ["FEATURE_CACHE.ENABLED", "False"]
    return build_seeded(toy_pets_cfg(trainer, config, root, tmp_path, clip_files, *opts))


def images(batch=3, seed=1):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_on_cpu_every_precision_runs_in_fp32(toy, tmp_path):
    """The engine's choice on CPU: the configs' PREC (DeAR amp, RAda fp16) and bf16 give no autocast."""
    for trainer, requested in (("DeAR", "amp"), ("RAda", "fp16")):
        amp = build(toy, trainer, tmp_path / trainer).amp
        assert (amp.requested, amp.prec, amp.dtype, amp.scaler) == (requested, "fp32", None, None)
    cpu_bf16 = MixedPrecision("bf16", torch.device("cpu"))
    assert (cpu_bf16.prec, cpu_bf16.dtype) == ("fp32", None)


@pytest.mark.parametrize("trainer", ["DeAR", "RAda"])
def test_training_step_under_bf16_autocast(toy, tmp_path, trainer):
    """Two steps of the trainer's forward_backward under bf16 autocast: products ran in bf16,
    the losses are finite, the second step's gradients are finite, fp32 and non-zero on every
    learnable tensor and absent from CLIP's frozen weights, and only the learnable tensors
    changed. (Two steps: RAda's generator starts at M = 1 with a zero output layer, so its
    query and key weights get exactly zero gradient in the first step, in fp32 as well.)"""
    trainer_ = build(toy, trainer, tmp_path)
    model = trainer_.model
    learnable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    before = {name: p.detach().clone() for name, p in learnable.items()}
    assert learnable and frozen

    dtypes = set()
    hooks = [module.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
             for module in model.modules() if isinstance(module, torch.nn.Linear)]
    batches = iter(trainer_.train_loader_x)
    trainer_.num_batches = 3  # two steps, not the epoch's last batch: no update_lr
    try:
        for trainer_.batch_idx in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                summary = trainer_.forward_backward(next(batches))
            assert all(math.isfinite(value) for value in summary.values()), summary
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.bfloat16 in dtypes

    for name, p in learnable.items():
        assert p.grad is not None and p.grad.dtype == torch.float32 and p.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
        assert not torch.equal(p.detach(), before[name]), name
    for name, p in model.named_parameters():
        if name in frozen:
            assert p.grad is None and torch.equal(p.detach(), frozen[name]), name


@pytest.mark.parametrize("trainer", ["DeAR", "RAda"])
def test_bf16_logits_are_close_to_fp32(toy, tmp_path, trainer):
    """Evaluation logits under bf16 autocast are the fp32 logits to LOGIT_TOLERANCE * tau
    (and differ from them: the products did run in bf16)."""
    model = build(toy, trainer, tmp_path).model.eval()
    scale = float(model.logit_scale)
    for seed in (1, 2, 3):
        x = images(batch=8, seed=seed)
        with torch.no_grad():
            full = model(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                half = model(x)
        assert full.dtype == torch.float32 and full.shape == half.shape == (8, 3)
        assert torch.isfinite(half).all()
        error = (half.float() - full).abs().max().item() / scale
        assert 0 < error < LOGIT_TOLERANCE, (seed, error)
