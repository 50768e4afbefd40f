"""Evaluation encodes the class text once, not once per test batch, for every trainer whose
text side does not depend on the image, including those whose registered module is only
the prompt learner (the model itself then stays in training mode)."""
import pytest
import torch
from baseline_setup import build_seeded, make_cfg, toy_world  # noqa: F401

TRAINERS = ("CoOp", "KgCoOp", "IVLP", "MaPLe", "PromptSRC", "VPT")


def count_text_passes(model):
    """Wrap ``model.compute_text_features``; returns the list its calls are appended to."""
    calls, compute = [], model.compute_text_features

    def counted():
        calls.append(torch.is_grad_enabled())
        return compute()

    model.compute_text_features = counted
    return calls


@pytest.mark.parametrize("name", TRAINERS)
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
