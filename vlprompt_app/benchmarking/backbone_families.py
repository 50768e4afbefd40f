"""Every trainer on every model family: two training steps and an evaluation, or a declared refusal.

Each case of the mixed-precision contract (one per distinct trainer configuration, so a new
trainer is covered once it has its benchmark case) is built from its synthetic config with the
backbone replaced by a small random model of a family (``vlprompt.testing.FAMILY_TEST_CONFIGS``),
in fp32, with stand-in classes instead of a dataset. ``FAMILIES`` are the families whose adapters
differ from the OpenAI layout's, which the mixed-precision contract runs every case on (the
tiny synthetic CLIP): SigLIP (timm ViT, attention pool, no class token, bidirectional text,
logit bias), EVA02 (timm Eva, rotary positions, class token) and PE-Core (timm Eva, rotary
positions, attention pool); the register ViT's layout is pinned by the runner's own tests.
``check_family`` records:

* a refusal: the UnsupportedBackboneError or ConfigError the trainer raised while it was built,
  and whether it came before the data (from the declared checks, which run before
  ``build_data_loader``);
* otherwise: the evaluation logits [B, K] (a test-time trainer adapts one episode on its
  views), and for trained cases the two steps' summaries and which parameters changed.

The tests (tests/test_trainer_families.py) assert that every case runs on every family, or
refuses with a reason before any data loads, and that the refusals are the ones the README lists.
"""
import contextlib
import io
import os.path as osp
import tempfile
from types import SimpleNamespace

import torch

from vlprompt.clip import UnsupportedBackboneError
from vlprompt.config import ConfigError
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import EVAL_ONLY, TEST_TIME
from vlprompt.testing import write_family_clip
from vlprompt_app.benchmarking import mixed_precision
from vlprompt_app.benchmarking.trainer_cases import SyntheticClasses

__all__ = ["FAMILIES", "FAMILY_OPTS", "family_backbones", "check_family"]

FAMILIES = ("siglip", "eva02", "pe_core")
# DeAR's head-role maps belong to one backbone each; the families' random models have none, so DeAR
# runs there with its map-free mask (every deep head a generalization head), which still masks.
FAMILY_OPTS = {"DeAR": ("TRAINER.DEAR.MASK_STRATEGY", "all_generalization")}


def family_backbones(directory, families=FAMILIES):
    """{family: (model config JSON, weights file)} of the families' small random models."""
    return {family: write_family_clip(osp.join(directory, family), family) for family in families}


class _NoData(SyntheticClasses):
    """Stand-in classes; records whether the data was built (a refusal must come before)."""

    data_built = False

    def build_data_loader(self):
        type(self).data_built = True
        super().build_data_loader()


def build_trainer(case, backbone, output_dir, opts=None):
    """The case's trainer on ``backbone`` (config, weights), fp32, stand-in classes; ``opts`` (KEY VALUE)
    replace the case's ``FAMILY_OPTS``."""
    trainer_class = type(f"Family{case.trainer}", (_NoData, TRAINER_REGISTRY.get(case.trainer)),
                         {"benchmark_classes": mixed_precision.CLASSES})
    torch.manual_seed(0)
    cfg = mixed_precision.build_cfg(case, "fp32", "cpu", output_dir, backbone=backbone,
                                    opts=FAMILY_OPTS.get(case.trainer, ()) if opts is None else opts)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = trainer_class(cfg)
        if case.after_build is not None:
            case.after_build(trainer)
    return trainer, trainer_class


def check_family(case, backbone, opts=None):
    """Run ``case`` on ``backbone`` (config, weights), with ``opts`` instead of its ``FAMILY_OPTS``;
    see the module docstring for the record."""
    with tempfile.TemporaryDirectory(prefix="family_") as output_dir:
        trainer_class = None
        try:
            trainer, trainer_class = build_trainer(case, backbone, osp.join(output_dir, "run"), opts)
        except (UnsupportedBackboneError, ConfigError) as error:
            return SimpleNamespace(refusal=str(error), before_data=not _NoData.data_built, logits=None, losses=None)
        finally:
            _NoData.data_built = False
        images = _images(case, trainer)
        logits = mixed_precision.evaluation_logits(case, trainer, images)
        record = SimpleNamespace(refusal=None, before_data=None, logits=logits, losses=None, changed=None,
                                 learnable=None, frozen_changed=None)
        if case.kind not in (EVAL_ONLY, TEST_TIME):
            model = trainer.model
            before = {name: p.detach().clone() for name, p in model.named_parameters()}
            labels = (torch.arange(mixed_precision.BATCH) % mixed_precision.CLASSES).to(trainer.device)
            record.losses = [mixed_precision.train_step(case, trainer, index,
                                                        mixed_precision.random_images(mixed_precision.BATCH, seed,
                                                                                      trainer.device), labels)
                             for index, seed in enumerate((2, 3))]
            params = dict(model.named_parameters())
            record.learnable = sorted(name for name, p in params.items() if p.requires_grad)
            record.changed = sorted(name for name, p in params.items() if not torch.equal(p.detach(), before[name]))
            record.frozen_changed = sorted(set(record.changed) - set(record.learnable))
        return record


def _images(case, trainer):
    """Seeded images [B, 3, 32, 32]; a test-time case's one image of NUM_VIEWS views [1, V, 3, 32, 32]."""
    size = mixed_precision.IMAGE_SIZE
    if case.kind == TEST_TIME:
        views = trainer.episode_cfg.NUM_VIEWS
        return mixed_precision.random_images(views, 1, trainer.device).view(1, views, 3, size, size)
    return mixed_precision.random_images(mixed_precision.BATCH, 1, trainer.device)
