"""Checks shared by the trainer tests: one training step changes exactly the learnable values,
and a saved checkpoint holds exactly the expected ones."""
import os

import torch
from baseline_setup import frozen, learnable


def one_step_changes_only_the_learnable(trainer):
    """Runs ``trainer.forward_backward`` on the first batch of its training loader and asserts that
    every parameter of ``trainer.model`` with requires_grad changed and every other one (CLIP's
    weights) did not.

    Returns:
        (names of the learnable parameters, names of the frozen ones, forward_backward's summary).
    """
    model = trainer.model
    before_learned, before_frozen = learnable(model), frozen(model)
    trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
    summary = trainer.forward_backward(next(iter(trainer.train_loader_x)))
    for name, value in learnable(model).items():
        assert not torch.equal(value, before_learned[name]), name
    for name, value in frozen(model).items():
        assert torch.equal(value, before_frozen[name]), name
    return set(before_learned), set(before_frozen), summary


def saved_keys(trainer, directory, model_name):
    """The state-dict keys of the checkpoint ``trainer.save_model`` writes for its model
    ``model_name`` after epoch 1 under ``directory`` (directory/model_name/model.pth.tar-1)."""
    trainer.save_model(0, str(directory))
    checkpoint = torch.load(os.path.join(directory, model_name, "model.pth.tar-1"), weights_only=True)
    return set(checkpoint["state_dict"])
