"""Every trainer on every model family (vlprompt_app/benchmarking/backbone_families.py): each
case of the mixed-precision contract, on a small random model of SigLIP, EVA02 and PE-Core (the
OpenAI layout: tests/test_mixed_precision.py), evaluates and takes two training steps, or refuses
with a reason before any data loads. A new trainer is covered once it has its benchmark case. The fast loop
runs a few representative cases (FAST) on every family; the others are marked slow."""
import math

import pytest
import torch
from clip_loads import shared_clip_loads  # noqa: F401  (the module's fixture)
from fast_cases import representative

from vlprompt_app.benchmarking import backbone_families, mixed_precision
from vlprompt.engine.benchmark_case import EVAL_ONLY, TEST_TIME
from vlprompt_app.benchmarking.trainer_cases import declared_cases

CONTRACT_CASES = mixed_precision.contract_cases(declared_cases())
# Text prompts (CoOp), deep prompts in both towers (MaPLe), a head mask in the image tower (DeAR), cached
# features (CLIP-Adapter), test-time episodes (TPT).
FAST = {"CoOp", "MaPLe", "DeAR", "CLIPAdapter", "TPT"}
CASE_PARAMS = representative(CONTRACT_CASES, FAST, name=lambda case: case.name)
FAMILIES = backbone_families.FAMILIES
pytestmark = pytest.mark.usefixtures("shared_clip_loads")  # each family's model is read once
# (trainer, family): why it refuses; the README's "Other backbones" lists the same. Every trainer runs on
# every family the runner drives; refusals are for image towers it does not drive (see below).
REFUSALS = {}


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    return backbone_families.family_backbones(str(tmp_path_factory.mktemp("families")), FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_every_trainer_runs_on_every_family_or_refuses_before_data(case, family, backbones):
    record = backbone_families.check_family(case, backbones[family])
    check_runs_or_refuses(case, record, REFUSALS.get((case.trainer, family)), f"on {family}")


def check_runs_or_refuses(case, record, expected, where):
    """A refusal is the ``expected`` one (the start of its reason), given before any data loads;
    a case that runs is not expected to refuse, its logits [rows, classes] are finite and, for a
    training case, its two steps' losses are finite, change learnable parameters and no frozen one."""
    if record.refusal is not None:
        assert expected is not None and expected in record.refusal, record.refusal
        assert record.before_data
        return
    assert expected is None, f"{case.name} runs {where}, but its refusal is listed"
    rows = 1 if case.kind == TEST_TIME else mixed_precision.BATCH
    assert record.logits.shape == (rows, mixed_precision.CLASSES)
    assert torch.isfinite(record.logits).all()
    if case.kind in (EVAL_ONLY, TEST_TIME):
        return
    for summary in record.losses:
        assert all(math.isfinite(value) for value in summary.values()), summary
    assert record.changed, "two steps changed no learnable parameter"
    assert record.frozen_changed == []


# Trainers that refuse an image tower the runner does not drive (a ResNet: open_clip's ModifiedResNet),
# with the start of their reason; the README's "Other backbones" lists the same. Every other trainer
# runs there (text prompts, adapters, RAda, full fine-tuning, TPT with CoOp or CoCoOp prompts).
NOT_A_VIT = "is not a ViT and takes no prompts"
RUNNER_NEEDED = "needs an image tower the prompted runner drives"
RESNET_REFUSALS = {
    "ATPrompt+MaPLe": NOT_A_VIT, "DePT": NOT_A_VIT, "IVLP": NOT_A_VIT, "MaPLe": NOT_A_VIT, "MaPLe+TPT": NOT_A_VIT,
    "PromptSRC": NOT_A_VIT, "RAdaPrompt": NOT_A_VIT, "VPT": NOT_A_VIT,
    "DeAR": RUNNER_NEEDED, "MMRL": RUNNER_NEEDED, "MMRLpp": RUNNER_NEEDED, "ProVP": RUNNER_NEEDED,
    "SkipTuning": RUNNER_NEEDED, "TAC": RUNNER_NEEDED,
    "MMA": "must adapt layers of both towers", "PromptAlign": "PromptAlign's statistics are of prompted image-tower",
    "PromptKD": "The PromptKD teacher's backbone",
}


@pytest.fixture(scope="module")
def resnet_backbone(tmp_path_factory):
    """A tiny ResNet CLIP whose text tower has the families' four layers (the cases' text prompt depths)."""
    from vlprompt.testing import FAMILY_TEST_CONFIGS, TINY_RESNET_CLIP_CONFIG, write_tiny_clip

    config = dict(TINY_RESNET_CLIP_CONFIG, text_cfg=FAMILY_TEST_CONFIGS["eva02"]["text_cfg"])
    return write_tiny_clip(str(tmp_path_factory.mktemp("resnet")), name="tiny-resnet-families", config=config)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_on_a_resnet_image_tower_a_trainer_runs_or_refuses_before_data(case, resnet_backbone):
    """Methods that edit the image tower refuse an image tower the runner does not drive (a ResNet),
    while the trainer is built and before the data, naming what they need; the rest train and evaluate."""
    record = backbone_families.check_family(case, resnet_backbone)
    check_runs_or_refuses(case, record, RESNET_REFUSALS.get(case.name), "on a ResNet")


def test_a_declared_refusal_names_the_trainer_and_the_tower(resnet_backbone):
    case = next(case for case in CONTRACT_CASES if case.trainer == "DeAR")
    record = backbone_families.check_family(case, resnet_backbone)
    assert record.refusal.startswith("DeAR needs an image tower the prompted runner drives (attribute tokens")
    assert "ModifiedResNet" in record.refusal
