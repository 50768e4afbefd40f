"""Every trainer on every model family (vlprompt_app/benchmarking/backbone_families.py): each
case of the mixed-precision contract, on a small random model of SigLIP, EVA02 and PE-Core (the
OpenAI layout: tests/test_mixed_precision.py), evaluates and takes two training steps, or refuses
with a reason before any data loads. A new trainer is covered once it has its benchmark case."""
import math

import pytest
import torch

from vlprompt_app.benchmarking import backbone_families, mixed_precision
from vlprompt.engine.benchmark_case import EVAL_ONLY, TEST_TIME
from vlprompt_app.benchmarking.trainer_cases import declared_cases

CONTRACT_CASES = mixed_precision.contract_cases(declared_cases())
FAMILIES = backbone_families.FAMILIES
# (trainer, family): why it refuses; the README's "Other backbones" lists the same. Every trainer runs on
# every family the runner drives; refusals are for image towers it does not drive (see below).
REFUSALS = {}


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    return backbone_families.family_backbones(str(tmp_path_factory.mktemp("families")), FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CONTRACT_CASES, ids=[case.name for case in CONTRACT_CASES])
def test_every_trainer_runs_on_every_family_or_refuses_before_data(case, family, backbones):
    record = backbone_families.check_family(case, backbones[family])
    expected = REFUSALS.get((case.trainer, family))
    if record.refusal is not None:
        assert expected is not None and expected in record.refusal, record.refusal
        assert record.before_data
        return
    assert expected is None, f"{case.trainer} on {family} runs, but REFUSALS lists it"
    rows = 1 if case.kind == TEST_TIME else mixed_precision.BATCH
    assert record.logits.shape == (rows, mixed_precision.CLASSES)
    assert torch.isfinite(record.logits).all()
    if case.kind in (EVAL_ONLY, TEST_TIME):
        return
    for summary in record.losses:
        assert all(math.isfinite(value) for value in summary.values()), summary
    assert record.changed, "two steps changed no learnable parameter"
    assert record.frozen_changed == []


def test_a_declared_refusal_comes_with_its_reason_before_data(tmp_path):
    """A method that prompts the image tower (DeAR) on an image tower the runner does not drive (a
    ResNet) refuses while its trainer is built, before the data, naming what it needs and why."""
    from vlprompt.testing import TINY_RESNET_CLIP_CONFIG, write_tiny_clip

    backbone = write_tiny_clip(str(tmp_path), name="tiny-resnet-refusal", config=TINY_RESNET_CLIP_CONFIG)
    case = next(case for case in CONTRACT_CASES if case.trainer == "DeAR")
    record = backbone_families.check_family(case, backbone)
    assert record.before_data
    assert record.refusal.startswith("DeAR needs an image tower the prompted runner drives (attribute tokens")
    assert "ModifiedResNet" in record.refusal
