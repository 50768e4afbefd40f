"""What every registered trainer declares on its class, checked for all of them at once (a new
trainer is covered without a test of its own): the precisions its TRAINER.<NAME>.PREC accepts,
which the engine refuses with a message naming the key and the allowed values, and, for a
method that needs a ViT image tower, why."""
import pytest
from fast_cases import representative

from vlprompt.clip import UnsupportedBackboneError
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer, SimpleTrainer
from vlprompt.engine.amp import PRECISIONS
from vlprompt_app.project import import_project

import_project()  # registers every trainer and its config node, as train.py does
NAMES = sorted(TRAINER_REGISTRY.registered_names())


def config_of(name, prec=None):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.TRAINER.NAME = name
    if prec is not None:
        cfg.TRAINER[name.upper()].PREC = prec
    return cfg


def has_precision(name):
    node = config_of(name).TRAINER.get(name.upper())
    return isinstance(node, dict) and "PREC" in node


def test_the_registry_holds_the_trainers_and_most_have_a_precision():
    assert len(NAMES) >= 30 and "CoOp" in NAMES and "MMRLpp" in NAMES
    assert sum(map(has_precision, NAMES)) >= 25


@pytest.mark.parametrize("name", representative(NAMES, {"CoOp", "DeAR", "MaPLe", "RAda", "ZeroshotCLIP"}))
def test_declared_precisions_hold_the_default_and_refuse_others_by_key(name):
    trainer = TRAINER_REGISTRY.get(name)
    assert issubclass(trainer, SimpleTrainer)
    assert trainer.precisions and set(trainer.precisions) <= set(PRECISIONS), trainer.precisions
    if not has_precision(name):
        assert "fp32" in trainer.precisions  # the engine runs such a trainer in fp32
        return
    cfg = config_of(name)
    default = cfg.TRAINER[name.upper()].PREC
    assert default in trainer.precisions
    for prec in trainer.precisions:
        trainer.check_declared_cfg(config_of(name, prec))
    key = f"TRAINER.{name.upper()}.PREC"
    allowed = ", ".join(repr(p) for p in trainer.precisions)
    with pytest.raises(ConfigError, match=rf"^{key} must be one of \[{allowed}\], got 'fp8'\.$"):
        trainer.check_declared_cfg(config_of(name, "fp8"))


@pytest.mark.parametrize("name", NAMES)
def test_a_vit_only_trainer_says_why(name):
    trainer = TRAINER_REGISTRY.get(name)
    reason = getattr(trainer, "vit_required_for", "")
    assert isinstance(reason, str)
    if reason:
        assert issubclass(trainer, ClipTrainer) and reason == reason.strip() and not reason.endswith(".")


def test_the_vit_only_trainers():
    vit_only = {name for name in NAMES if getattr(TRAINER_REGISTRY.get(name), "vit_required_for", "")}
    assert vit_only >= {"DeAR", "MMRL", "MMRLpp", "PromptKD", "ProVP", "SkipTuning", "TAC"}
    assert not vit_only & {"CoOp", "ZeroshotCLIP", "CLIPAdapter"}


@pytest.mark.parametrize("name", ["DeAR", "MMRLpp", "CoOp"])
def test_a_vit_only_trainer_refuses_a_backbone_without_a_prompted_image_tower_before_data(name):
    """The declared check reads the backbone's family (built on the meta device: no weights, no
    data) and refuses a ResNet image tower for a method that prompts the image tower."""
    cfg = config_of(name)
    cfg.MODEL.BACKBONE.NAME = "RN50"
    trainer = TRAINER_REGISTRY.get(name)
    reason = trainer.vit_required_for
    if not reason:
        trainer.check_declared_cfg(cfg)
        return
    message = (rf"^{name} needs an image tower the prompted runner drives \({reason}\); MODEL.BACKBONE.NAME RN50 "
               r"has none: The image tower is a ModifiedResNet")
    with pytest.raises(UnsupportedBackboneError, match=message):
        trainer.check_declared_cfg(cfg)


@pytest.mark.parametrize("name", NAMES)
def test_a_trainer_scores_other_class_names_or_says_why_not(name):
    trainer = TRAINER_REGISTRY.get(name)
    reason = trainer.unseen_classes_refusal
    assert isinstance(reason, str) and reason == reason.strip() and not reason.endswith(".")
    uses_a_linear_head = bool(getattr(trainer, "classifier_keys", ()))
    assert bool(reason) == uses_a_linear_head, (name, reason)


def test_text_feature_exports_are_declared_by_plain_image_tower_methods_only():
    exporting = {name for name in NAMES if getattr(TRAINER_REGISTRY.get(name), "exports_class_text_features", False)}
    assert exporting >= {"CoOp", "KgCoOp", "ProGrad", "ZeroshotCLIP"}
    assert not exporting & {"MaPLe", "DeAR", "RAda", "CLIPAdapter", "TPT", "LP"}
