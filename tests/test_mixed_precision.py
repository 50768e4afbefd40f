"""Every trainer under mixed precision on the CPU: the contract of
vlprompt_app/benchmarking/mixed_precision.py over the benchmark's cases (one per registered
trainer at least, which tests/test_benchmark.py enforces), so a new trainer is covered once it
has its case, without a test of its own.

Each case runs from its synthetic config, on the smallest CLIP its trainer builds on
(tests/small_clips.py: a random CLIP of one block per tower, else the tiny synthetic CLIP its config
is written for), with TRAIN.CPU_AUTOCAST at TRAINER.<NAME>.PREC fp16 (autocast and a GradScaler) and
bf16 (autocast, no scaler): the evaluation logits are close to fp32's and fp32's are unchanged by the
autocast evaluation; two training steps give finite losses and finite fp32 gradients and change the
learnable parameters only. At fp16 (the precision with the most state: the scaler's) the checkpoint
written after the two steps also resumes to the state a third step reaches without the interruption,
and the evaluation and the steps make no tensor without the device of the data it meets and draw no
random numbers with a data device's generator (vlprompt_app/benchmarking/device_placement.py); those
checks do not depend on the autocast dtype, so bf16 leaves them out to keep the file short.
The fast loop runs one case of each kind (FAST); the others are marked slow.
"""
import math

import pytest
import torch
from clip_loads import shared_clip_loads  # noqa: F401  (the module's fixture)
from fast_cases import representative
from small_clips import backbone_opts, one_block_clip, smallest_fitting_clip  # noqa: F401  (a fixture)

from vlprompt_app.benchmarking import mixed_precision
from vlprompt.engine.benchmark_case import EVAL_ONLY, TEST_TIME
from vlprompt_app.benchmarking.trainer_cases import declared_cases

CONTRACT_CASES = mixed_precision.contract_cases(declared_cases())
# Prompts through the text tower (CoOp), per-image text (CoCoOp), deep prompts and a head mask in the image
# tower (DeAR), cached features (CLIP-Adapter), an evaluation only (zero-shot CLIP), test-time episodes (TPT).
FAST = {"CoOp", "CoCoOp", "DeAR", "CLIPAdapter", "ZeroshotCLIP", "TPT"}
pytestmark = pytest.mark.usefixtures("shared_clip_loads")  # the synthetic CLIP is read once

# The largest |autocast logit - fp32 logit| over CLIP's temperature tau (logits are tau times a
# cosine). fp16 keeps 11 significant bits (unit roundoff 2^-11 = 0.00049) and bf16 8 (2^-8 =
# 0.0039). Measured (2 to 4 images, 5 classes, every case on its CLIP; test-time episodes at
# mixed_precision.EPISODE_LR): at most 0.0009 (fp16, MMRL) and 0.0055 (bf16, MMRL++), both on the
# synthetic CLIP (on the one-block CLIP 0.0004 and 0.0026), one or two roundoffs of a cosine. The
# tolerances are 8 roundoffs.
LOGIT_TOLERANCE = {"fp16": 8 * 2.0 ** -11, "bf16": 8 * 2.0 ** -8}


@pytest.mark.parametrize("prec", ["fp16", "bf16"])
@pytest.mark.parametrize("case", representative(CONTRACT_CASES, FAST, name=lambda case: case.name))
def test_mixed_precision_contract(case, prec, one_block_clip):  # noqa: F811
    thorough = prec == "fp16"
    record = mixed_precision.check_case(case, prec, resume=thorough, placement=thorough,
                                        opts=smallest_fitting_clip(case, one_block_clip))
    if record.has_precision:
        assert record.dtype == mixed_precision.AUTOCAST_DTYPES[prec]
        assert record.scaler == (prec == "fp16")
    else:  # zero-shot CLIP: nothing to train, the contract autocasts its evaluation
        assert case.kind == EVAL_ONLY and (record.dtype, record.scaler) == (None, False)
    assert record.logits_finite
    assert 0 < record.logits_error / record.logit_scale < LOGIT_TOLERANCE[prec], record.logits_error
    assert record.amp_warnings == []
    assert record.fp32_repeatable  # the autocast evaluation left no half-precision value in a cache
    if thorough:
        assert record.deviceless == [], record.deviceless
        assert record.device_draws == [], record.device_draws
    if case.kind in (EVAL_ONLY, TEST_TIME):
        assert record.losses is None
        return
    for summary in record.losses:
        assert all(math.isfinite(value) for value in summary.values()), summary
    assert record.skipped_steps == 0
    assert record.learnable and record.frozen_changed == []
    assert record.changed, "two steps changed no learnable parameter"
    assert record.grads_finite and all(record.grads_finite.values()), record.grads_finite
    assert set(record.grad_dtypes.values()) == {torch.float32}
    if thorough:
        assert record.resume_differences == [], record.resume_differences


COOP = next(case for case in CONTRACT_CASES if case.name == "CoOp")


def test_the_contract_sees_a_lost_scaler_state_and_a_deviceless_tensor(monkeypatch, one_block_clip):  # noqa: F811
    """The contract can fail: a resume that drops the scaler's state, and a step that adds a
    tensor made without the data's device, are both reported (CoOp at fp16, on the one-block CLIP)."""
    from vlprompt.engine.amp import MixedPrecision
    from vlprompt.methods.text_context import CoOpCLIP

    monkeypatch.setattr(MixedPrecision, "load_state_dict", lambda self, state: None)
    forward = CoOpCLIP.forward
    monkeypatch.setattr(CoOpCLIP, "forward", lambda self, images: forward(self, images) + torch.zeros(5))
    record = mixed_precision.check_case(COOP, "fp16", opts=backbone_opts(one_block_clip))
    assert {"state.scaler.scale", "state.scaler._growth_tracker"} <= set(record.resume_differences)
    assert [fault.operation for fault in record.deviceless] == ["add"]
    assert record.deviceless[0].origin.startswith("tests/test_mixed_precision.py:")
