"""Every trainer on every model family (vlprompt_app/benchmarking/backbone_families.py): each
case of the mixed-precision contract, on a small random model of each family the runner drives
(OpenAI layout, SigLIP, EVA02, PE-Core, a register ViT), evaluates and takes two training steps,
or refuses with a reason before any data loads. A new trainer is covered once it has its
benchmark case."""
import math

import pytest
import torch

from vlprompt_app.benchmarking import backbone_families, mixed_precision
from vlprompt.engine.benchmark_case import EVAL_ONLY, TEST_TIME
from vlprompt_app.benchmarking.trainer_cases import declared_cases

CONTRACT_CASES = mixed_precision.contract_cases(declared_cases())
NEW_FAMILIES = tuple(family for family in backbone_families.FAMILIES if family != "openai")  # openai: the contract's
# (trainer, family): why it refuses; the README's "Other backbones" lists the same.
REFUSALS = {}


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    return backbone_families.family_backbones(str(tmp_path_factory.mktemp("families")), NEW_FAMILIES)


@pytest.mark.parametrize("family", NEW_FAMILIES)
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
