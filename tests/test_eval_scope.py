"""Evaluation scopes (vlprompt/engine/eval_scope.py): inference, override, errors, ScopeRule, the
record in results.json, and DeAR's INFERENCE auto through a trainer and through train.py
(tiny random CLIP, miniature OxfordPets and Caltech101 trees)."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from vlprompt_app.commands import train
from mini_datasets import write_caltech101
from vlprompt.clip.head_roles import parse_role_map
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine.config_checks import validate_cfg
from vlprompt.engine import build_trainer
from vlprompt.engine.option_rules import ScopeRule
from vlprompt.engine.eval_scope import EVAL_SCOPES, eval_scope, infer_eval_scope, resolve_eval_scope
from vlprompt.engine.run_folder import RunFolder
from vlprompt.testing import write_oxford_pets_tree, write_tiny_clip
from vlprompt.utils import close_logger, set_random_seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE2NEW = os.path.join(ROOT, "configs/trainers/DeAR/vit_b16_base2new.yaml")
TINY_ROLES = {
    "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
    "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
}


def cfg_of(name="OxfordPets", subsample="all", role=""):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.DATASET.NAME, cfg.DATASET.SUBSAMPLE_CLASSES, cfg.TEST.ROLE = name, subsample, role
    return cfg


def trained_folder(tmp_path, name, subsample="base"):
    """A training run folder whose config.yaml says it trained on ``name``."""
    folder = tmp_path / f"trained_{name}"
    folder.mkdir()
    RunFolder(folder).write_config(cfg_of(name, subsample))
    return str(folder)


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize("subsample, role", [("base", "base"), ("all", "source")])
def test_a_training_run_evaluates_its_training_classes(subsample, role):
    assert infer_eval_scope(cfg_of(subsample=subsample)).scope == role


@pytest.mark.parametrize("subsample, role", [("base", "base"), ("new", "new"), ("all", "source")])
def test_eval_only_on_the_training_dataset_follows_the_subsample(tmp_path, subsample, role):
    model_dir = trained_folder(tmp_path, "OxfordPets")
    found = infer_eval_scope(cfg_of("OxfordPets", subsample), eval_only=True, model_dir=model_dir)
    assert (found.scope, found.warning) == (role, "")
    # without a trained model (zero-shot methods) the same rule applies
    assert infer_eval_scope(cfg_of("OxfordPets", subsample), eval_only=True).scope == role


@pytest.mark.parametrize("subsample", ["base", "new", "all"])
def test_eval_only_on_another_dataset_is_a_target(tmp_path, subsample):
    model_dir = trained_folder(tmp_path, "ImageNet", "all")
    found = infer_eval_scope(cfg_of("ImageNetSketch", subsample), eval_only=True, model_dir=model_dir)
    assert found.scope == "target"
    assert "trained on ImageNet" in found.reason and "evaluates ImageNetSketch" in found.reason


def test_training_results_json_is_read_when_there_is_no_config_yaml(tmp_path):
    record = {"dataset": "OxfordPets", "subsample_classes": "base", "eval_only": False, "completed": True}
    (tmp_path / "results.json").write_text(json.dumps(record))
    assert infer_eval_scope(cfg_of("Caltech101"), eval_only=True, model_dir=str(tmp_path)).scope == "target"
    # an eval-only record in that folder says nothing about the training data
    (tmp_path / "results.json").write_text(json.dumps(dict(record, eval_only=True)))
    found = infer_eval_scope(cfg_of("Caltech101", "new"), eval_only=True, model_dir=str(tmp_path))
    assert found.scope == "new" and "--eval-role target" in found.warning


def test_a_folder_without_records_warns_and_assumes_the_same_dataset(tmp_path):
    found = infer_eval_scope(cfg_of("Caltech101", "all"), eval_only=True, model_dir=str(tmp_path))
    assert found.scope == "source"
    assert f'"{tmp_path}" records no training dataset (config.yaml or a training results.json)' in found.warning


def test_unreadable_config_yaml_is_a_clear_error(tmp_path):
    (tmp_path / "config.yaml").write_text("DATASET: [unclosed\n")
    with pytest.raises(ConfigError, match=r"Cannot read the training dataset from .*config.yaml.*--eval-role"):
        infer_eval_scope(cfg_of(), eval_only=True, model_dir=str(tmp_path))


def test_given_role_wins_and_the_log_reason_names_the_inferred_one(tmp_path):
    model_dir = trained_folder(tmp_path, "OxfordPets")
    found = resolve_eval_scope(cfg_of("Caltech101", role="source"), eval_only=True, model_dir=model_dir)
    assert found.scope == "source"
    assert "given by TEST.ROLE / --eval-role; inferred from the run it would be target" in found.reason
    agreeing = resolve_eval_scope(cfg_of("Caltech101", role="target"), eval_only=True, model_dir=model_dir)
    assert agreeing.reason == "given by TEST.ROLE / --eval-role"


def test_invalid_role_lists_the_four_roles():
    message = r"TEST.ROLE \(--eval-role\) must be one of base, new, source, target .* got 'novel'"
    for check in (resolve_eval_scope, eval_scope, validate_cfg):
        with pytest.raises(ConfigError, match=message):
            check(cfg_of(role="novel"))


def test_eval_role_of_a_config_without_a_resolved_role():
    assert [eval_scope(cfg_of(subsample=s)) for s in ("base", "new", "all")] == ["base", "new", "source"]
    assert [eval_scope(cfg_of(role=r)) for r in EVAL_SCOPES] == list(EVAL_SCOPES)


# ----------------------------------------------------------------------------- ScopeRule


def test_scope_rule_auto_follows_the_scope_and_explicit_values_override():
    rule = ScopeRule("TRAINER.X.HEAD", base="fused", new="sim", source="fused", target="sim")
    assert rule.choices == ("auto", "fused", "sim")
    assert [rule.resolve("auto", role) for role in EVAL_SCOPES] == ["fused", "sim", "fused", "sim"]
    assert [rule.resolve("sim", role) for role in EVAL_SCOPES] == ["sim"] * 4
    assert rule.describe("auto", "new") == "TRAINER.X.HEAD: sim (auto for the new scope)"
    assert rule.describe("fused", "new") == "TRAINER.X.HEAD: fused (set explicitly; evaluation scope new)"
    with pytest.raises(ConfigError, match=r"TRAINER.X.HEAD must be one of \['auto', 'fused', 'sim'\], got 'head' "
                                          r"\(auto: base fused, new sim, source fused, target sim\)"):
        rule.check("head")
    with pytest.raises(ValueError, match=r"missing \['target'\]"):
        ScopeRule("TRAINER.X.HEAD", base="a", new="b", source="c")


# ----------------------------------------------------------------------------- DeAR


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(data root with OxfordPets and Caltech101, tiny CLIP config, weights, role map)."""
    base = tmp_path_factory.mktemp("eval_roles")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-roles")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=3)
    write_caltech101(str(base / "data"))
    role_map = str(base / "roles.yaml")
    parse_role_map(TINY_ROLES).save(role_map)
    return base, config, weights, role_map


def tiny_opts(world):
    _, config, weights, role_map = world
    return ["MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, "INPUT.SIZE", "(32, 32)",
            "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "OPTIM.MAX_EPOCH", "1",
            "TRAINER.DEAR.ROLE_MAP", role_map, "TRAINER.DEAR.INJECT_LAYER", "2",
            "TRAINER.DEAR.ATTRIBUTES", "['color', 'shape']", "USE_CUDA", "False"]


def dear_trainer(world, output_dir, *opts):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/datasets/caltech101.yaml"))
    merge_from_file(cfg, BASE2NEW)
    merge_from_list(cfg, ["DATASET.ROOT", str(world[0] / "data"), "OUTPUT_DIR", str(output_dir),
                          "TRAINER.NAME", "DeAR", *tiny_opts(world), *opts])
    cfg.freeze()
    set_random_seed(1)
    trainer = build_trainer(cfg)
    with torch.no_grad():  # learned-looking values, so that fusion and f_cls differ clearly
        for param in trainer.model.prompt_learner.parameters():
            param.add_(2.0 * torch.randn_like(param))
    return trainer


def dear_logits(trainer):
    """(logits the trainer computes, cls-only logits, fused logits) for one test batch."""
    images, _ = trainer.parse_batch_test(next(iter(trainer.test_loader)))
    model = trainer.set_model_mode("eval") or trainer.model
    with torch.no_grad(), model.evaluation():
        f_cls, f_attr, _ = model.encode_image(images)
        text = model.class_text_features()
        cls_only = model.logit_scale * F.normalize(f_cls, dim=-1) @ text.t()
        return trainer.model_inference(images), cls_only, model.fused_logits(f_cls, f_attr, text)


@pytest.mark.parametrize("role, opts, uses", [
    ("target", [], "cls"),
    ("base", [], "fusion"),
    ("new", [], "fusion"),
    ("source", [], "fusion"),
    ("target", ["TRAINER.DEAR.INFERENCE", "fusion"], "fusion"),
    ("base", ["TRAINER.DEAR.INFERENCE", "cls"], "cls"),
])
def test_dear_base2new_config_uses_f_cls_on_targets_and_fusion_elsewhere(world, tmp_path, role, opts, uses):
    trainer = dear_trainer(world, tmp_path, "TEST.ROLE", role, *opts)
    assert trainer.eval_scope == role and trainer.model.inference == uses
    logits, cls_only, fused = dear_logits(trainer)
    assert not torch.allclose(cls_only, fused, atol=1e-3)
    torch.testing.assert_close(logits, cls_only if uses == "cls" else fused, rtol=1e-5, atol=1e-5)


def run_train(world, output_dir, dataset, *extra):
    """train.py in this process with the base2new DeAR config; ``extra``: flags, then KEY VALUE
    pairs (the tiny model's overrides follow them). Returns (exit status, log text)."""
    argv = ["--root", str(world[0] / "data"), "--trainer", "DeAR", "--seed", "1",
            "--dataset-config-file", os.path.join(ROOT, f"configs/datasets/{dataset}.yaml"),
            "--config-file", BASE2NEW, "--output-dir", str(output_dir), *extra]
    try:
        status = train.run([*argv, *tiny_opts(world), "DATASET.NUM_SHOTS", "2"])
    finally:
        close_logger()
    log = (output_dir / "log.txt").read_text() if (output_dir / "log.txt").exists() else ""
    return status, log


def results(folder):
    return json.loads((folder / "results.json").read_text())


def test_train_py_infers_the_scope_of_each_evaluation(world, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    trained = tmp_path / "train_base"
    status, log = run_train(world, trained, "oxford_pets", "DATASET.SUBSAMPLE_CLASSES", "base")
    assert status == 0, log[-3000:]
    assert "Evaluation scope: base (a training run evaluates its training classes (base classes of OxfordPets))" in log
    assert "TRAINER.DEAR.INFERENCE: fusion (auto for the base scope)" in log
    assert results(trained)["eval_role"] == "base"
    assert "NAME: OxfordPets" in (trained / "config.yaml").read_text()

    new = tmp_path / "test_new"
    status, log = run_train(world, new, "oxford_pets", "--eval-only", "--model-dir", str(trained),
                            "--load-epoch", "1", "DATASET.SUBSAMPLE_CLASSES", "new")
    assert status == 0, log[-3000:]
    assert "Evaluation scope: new (the new classes of OxfordPets, the model's training dataset)" in log
    assert "TRAINER.DEAR.INFERENCE: fusion (auto for the new scope)" in log
    assert results(new)["eval_role"] == "new" and not (new / "config.yaml").exists()

    target = tmp_path / "caltech101"
    status, log = run_train(world, target, "caltech101", "--eval-only", "--model-dir", str(trained),
                            "--load-epoch", "1")
    assert status == 0, log[-3000:]
    assert (f"Evaluation scope: target (the model was trained on OxfordPets ({trained / 'config.yaml'}), "
            "this run evaluates Caltech101)") in log
    assert "TRAINER.DEAR.INFERENCE: cls (auto for the target scope)" in log
    record = results(target)
    assert record["eval_role"] == "target" and record["dataset"] == "Caltech101" and record["num_classes"] == 5

    forced = tmp_path / "caltech101_as_source"
    status, log = run_train(world, forced, "caltech101", "--eval-only", "--model-dir", str(trained),
                            "--load-epoch", "1", "--eval-role", "source")
    assert status == 0, log[-3000:]
    assert "Evaluation scope: source (given by TEST.ROLE / --eval-role; inferred from the run it would be target" in log
    assert "TRAINER.DEAR.INFERENCE: fusion (auto for the source scope)" in log
    assert results(forced)["eval_role"] == "source"

    capsys.readouterr()
    status, _ = run_train(world, tmp_path / "bad", "caltech101", "--eval-only", "--eval-role", "novel")
    assert status == 2
    assert "TEST.ROLE (--eval-role) must be one of base, new, source, target" in capsys.readouterr().err


def test_readme_role_rule_example():
    from test_readme import code_blocks, section

    namespace = {}
    exec(compile(code_blocks(section("Adding a trainer"), "python")[1], "README-role-rule", "exec"), namespace)
    head = namespace["HEAD"]
    assert [head.resolve("auto", role) for role in EVAL_SCOPES] == ["fused", "text", "fused", "text"]
