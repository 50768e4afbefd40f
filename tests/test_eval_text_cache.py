"""Evaluation encodes the class text once, not once per test batch, for every trainer whose
text side does not depend on the image, including those whose registered module is only
the prompt learner (the model itself then stays in training mode)."""
import pytest
import torch
from baseline_setup import build_seeded, make_cfg, toy_world  # noqa: F401
from fast_cases import representative

from vlprompt_app.benchmarking import mixed_precision
from vlprompt_app.benchmarking.trainer_cases import case_named

TRAINERS = ("CoOp", "KgCoOp", "IVLP", "MaPLe", "PromptSRC", "VPT")


def count_text_passes(model):
    """Wrap ``model.compute_text_features``; returns the list its calls are appended to."""
    calls, compute = [], model.compute_text_features

    def counted():
        calls.append(torch.is_grad_enabled())
        return compute()

    model.compute_text_features = counted
    return calls


@pytest.mark.parametrize("name", representative(TRAINERS, {"CoOp", "MaPLe"}))
def test_class_text_is_encoded_once_per_evaluation(toy_world, tmp_path, name):  # noqa: F811
    trainer = build_seeded(make_cfg(toy_world, name, tmp_path, DATALOADER__TEST__BATCH_SIZE=3))
    assert len(trainer.test_loader) == 4
    calls = count_text_passes(trainer.model)
    trainer.set_model_mode("train")
    first = trainer.test()
    assert calls == [False]
    assert trainer.test() == first
    assert calls == [False, False]  # a new evaluation encodes again (prompts may have changed)
    if name != "VPT":  # VPT's text side is a fixed buffer
        trainer.set_model_mode("train")
        trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
        trainer.forward_backward(next(iter(trainer.train_loader_x)))
        assert calls[2:] == [True]  # training recomputes with autograd, nothing cached


def test_eval_mode_text_features_follow_the_autocast_state(toy_world, tmp_path):  # noqa: F811
    """In eval mode (outside ``evaluation()``) the cached class text features belong to the autocast
    state they were computed in: fp32 after a bf16 call gives the fp32 features, not the cached
    bf16 ones."""
    model = build_seeded(make_cfg(toy_world, "CoOp", tmp_path)).model.eval()
    with torch.no_grad():
        fp32 = model.class_text_features()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model.class_text_features()
        again = model.class_text_features()
    assert half.dtype == torch.bfloat16 and again.dtype == torch.float32
    assert torch.equal(again, fp32)


@pytest.mark.parametrize("name", representative(["PromptSRC", "MMRL", "DeAR"], {"DeAR"}))
def test_moving_the_model_drops_its_frozen_text_targets(tmp_path, name):
    """The frozen-CLIP text targets a training step caches belong to the model's device and dtype:
    moving or casting the model drops them (and the evaluation cache) so they are computed again there."""
    case = case_named(name)
    trainer = mixed_precision.build_trainer(case, "bf16", "cpu", str(tmp_path))
    labels = torch.arange(2)
    mixed_precision.train_step(case, trainer, 0, mixed_precision.random_images(2, 0, trainer.device), labels)
    model = trainer.model
    assert model._frozen_text is not None
    model.to(torch.device("cpu"))
    assert model._frozen_text is None and model._eval_text_features is None
