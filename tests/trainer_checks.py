"""Checks shared by the trainer tests: one training step changes exactly the learnable values,
a saved checkpoint holds exactly the expected ones, bad config values stop the build with their
key's error, and MMRL-style role inference."""
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, frozen, learnable

from vlprompt.config import ConfigError


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


def assert_config_errors(make_cfg, cases):
    """For each ``(opts, message)`` of ``cases``, building a trainer from ``make_cfg(*opts)``
    (opts: KEY, VALUE, ... overrides) raises a ConfigError whose text matches the regex ``message``."""
    for opts, message in cases:
        with pytest.raises(ConfigError, match=message):
            build_seeded(make_cfg(*opts))


def saved_keys(trainer, directory, model_name):
    """The state-dict keys of the checkpoint ``trainer.save_model`` writes for its model
    ``model_name`` after epoch 1 under ``directory`` (directory/model_name/model.pth.tar-1)."""
    trainer.save_model(0, str(directory))
    checkpoint = torch.load(os.path.join(directory, model_name, "model.pth.tar-1"), weights_only=True)
    return set(checkpoint["state_dict"])


def assert_fusion_and_class_token_inference(fusion, cls, images, hand_image, hand_text, tol, alpha=0.7):
    """MMRL's and MMRL++'s inference against hand computations: ``fusion(images)`` [B, C] must be
    α·z_c + (1 − α)·z_r and ``cls(images)`` z_c, with z = 100·f̂·t̂ᵀ of the class-token feature f_cls
    and the representation feature f_rep that ``hand_image(model, images)`` returns and the class
    text features [C, D] of ``hand_text(model)``."""
    with torch.no_grad():
        f_cls, f_rep = hand_image(fusion, images)
        t_hat = F.normalize(hand_text(fusion), dim=-1)
        z_c = 100 * F.normalize(f_cls, dim=-1) @ t_hat.t()
        z_r = 100 * F.normalize(f_rep, dim=-1) @ t_hat.t()
        torch.testing.assert_close(fusion(images), alpha * z_c + (1 - alpha) * z_r, **tol)
        torch.testing.assert_close(cls(images), z_c, **tol)
