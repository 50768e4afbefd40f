"""DePT: the base method's prompts + FiLM + a linear head on unnormalised features; loss
(1 - w) CE_sim + w CE_head over [text; image] rows; fused inference on base classes only
(trainers/dept.py)."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import (  # noqa: F401
    build_seeded, tiny_node, tiny_runner, toy_world, toy_world_cfg, trainer_node,
)
from trainer_checks import assert_config_errors, one_step_changes_only_the_learnable

from trainers.dept import DePTCLIP
from vlprompt.config import ConfigError
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.text_context import CoOpCLIP

CLASSNAMES = ["abyssinian", "american bulldog", "bengal"]
TOL = dict(rtol=1e-5, atol=1e-5)
BASES = {"CoOp": (CoOpCLIP, "CoOp"), "MaPLe": (MaPLeCLIP, "MaPLe")}


def build_base(tiny_runner, base):  # noqa: F811
    runner, tokenizer = tiny_runner
    model_class, node = BASES[base]
    torch.manual_seed(0)
    return model_class(runner, tokenizer, CLASSNAMES, tiny_node(node))


def build_model(tiny_runner, base="MaPLe", inference="fused", head_classes=3, perturb=True, **changes):  # noqa: F811
    model = DePTCLIP(build_base(tiny_runner, base), trainer_node("DEPT", **changes), inference, head_classes)
    if perturb:  # FiLM away from its identity init, so a transform on the wrong features shows
        with torch.no_grad():
            model.film_image.scale.normal_(1.0, 0.5)
            model.film_image.shift.normal_(0.0, 0.5)
            model.film_text.scale.normal_(1.0, 0.5)
            model.film_text.shift.normal_(0.0, 0.5)
    return model


def images(n=4):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("base", ["CoOp", "MaPLe"])
def test_identity_film_and_sim_inference_give_the_base_methods_logits(tiny_runner, base):  # noqa: F811
    model = build_model(tiny_runner, base, inference="sim", perturb=False)
    assert torch.equal(model.film_image.scale, torch.ones(32)) and torch.equal(model.film_text.shift, torch.zeros(32))
    reference = build_base(tiny_runner, base)
    reference.load_state_dict(model.base.state_dict())
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), **TOL)


def test_head_reads_the_unnormalised_film_transformed_image_feature(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner)
    x = images()
    with torch.no_grad():
        f = model.base.unnormalised_image_features(x)
        assert (f.norm(dim=-1) - 1).abs().min() > 0.1  # really unnormalised
        expected = (model.film_image.scale * f + model.film_image.shift) @ model.head.weight.t() + model.head.bias
        torch.testing.assert_close(model.head_logits(f), expected, **TOL)
        on_normalised = model.head(model.film_image(F.normalize(f, dim=-1)))
        assert (on_normalised - expected).abs().max() > 1e-2


def independent_loss(model, x, labels, w):
    """(1 - w) CE(s f̂ t̂ᵀ, y) + w CE(W [γ_T t_y + β_T ; γ_I f + β_I] + b, [y; y]), written out."""
    f = model.base.unnormalised_image_features(x)
    t = model.base.compute_text_features()
    s = model.clip.logit_scale.exp()
    sim = s * (f / f.norm(dim=-1, keepdim=True)) @ (t / t.norm(dim=-1, keepdim=True)).t()
    text_rows = model.film_text.scale * t[labels] + model.film_text.shift
    image_rows = model.film_image.scale * f + model.film_image.shift
    rows = torch.cat([text_rows, image_rows])
    head = rows @ model.head.weight.t() + model.head.bias
    targets = torch.cat([labels, labels])
    ce_head = -head.log_softmax(-1)[torch.arange(len(targets)), targets].mean()
    ce_sim = -sim.log_softmax(-1)[torch.arange(len(labels)), labels].mean()
    return (1 - w) * ce_sim + w * ce_head, ce_sim, ce_head, sim, head[len(labels):]


def test_loss_on_one_batch_equals_an_independent_computation(tiny_runner):  # noqa: F811
    model = build_model(tiny_runner, HEAD_WEIGHT=0.7)
    x, labels = images(), torch.tensor([2, 0, 1, 2])
    loss, logits, terms = model.loss(x, labels)
    with torch.no_grad():
        expected, ce_sim, ce_head, sim, head = independent_loss(model, x, labels, 0.7)
        torch.testing.assert_close(loss, expected, **TOL)
        torch.testing.assert_close(terms["ce"], ce_sim, **TOL)
        torch.testing.assert_close(terms["head"], ce_head, **TOL)
        torch.testing.assert_close(logits, 0.3 * sim + 0.7 * head, **TOL)
        # The text rows count: the head's CE over the image rows alone differs.
        assert abs(F.cross_entropy(head, labels).item() - ce_head.item()) > 1e-3


def test_fused_inference_is_the_weighted_sum_of_logits_and_sim_leaves_out_the_head(tiny_runner):  # noqa: F811
    fused, sim = build_model(tiny_runner, inference="fused"), build_model(tiny_runner, inference="sim")
    sim.load_state_dict(fused.state_dict())
    x = images()
    with torch.no_grad():
        f = fused.base.unnormalised_image_features(x)
        similarity = fused.similarity_logits(f, fused.class_text_features())
        torch.testing.assert_close(fused(x), 0.3 * similarity + 0.7 * fused.head_logits(f), **TOL)
        torch.testing.assert_close(sim(x), similarity, **TOL)
    with pytest.raises(ValueError, match="head"):
        build_model(tiny_runner, inference="fused", head_classes=0)


def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    return toy_world_cfg(toy_world, "DePT", "DePT/vit_b16_maple.yaml", tmp_path, "DATALOADER.TRAIN_X.BATCH_SIZE", "4",
                         "TRAINER.DEPT.PREC", "fp32", "TRAINER.MAPLE.PROMPT_DEPTH", "2", *opts)


@pytest.mark.parametrize("role, subsample, inference, expected, has_head", [
    ("base", "base", "auto", "fused", True),
    ("source", "all", "auto", "fused", True),
    ("new", "new", "auto", "sim", False),
    ("target", "all", "auto", "sim", False),
    ("base", "base", "sim", "sim", True),  # explicit override
])
def test_inference_follows_the_evaluation_scope(toy_world, tmp_path, role, subsample, inference, expected,  # noqa: F811
                                               has_head):
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "TEST.ROLE", role, "DATASET.SUBSAMPLE_CLASSES", subsample,
                                    "TRAINER.DEPT.INFERENCE", inference))
    assert trainer.model.inference == expected
    assert (trainer.model.head is not None) == has_head
    if has_head:
        assert trainer.model.head.out_features == len(trainer.classnames)
    else:
        assert {"head.weight", "head.bias"} <= set(trainer.get_class_dependent_keys("DePT"))


def test_the_head_is_never_applied_to_classes_it_was_not_trained_on(toy_world, tmp_path):  # noqa: F811
    for role, subsample in (("new", "new"), ("target", "all")):
        with pytest.raises(ConfigError, match=f"INFERENCE fused needs the linear head.*the {role} scope"):
            build_seeded(pets_cfg(toy_world, tmp_path, "TEST.ROLE", role, "DATASET.SUBSAMPLE_CLASSES", subsample,
                                  "TRAINER.DEPT.INFERENCE", "fused"))


def test_two_learning_rate_groups(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base"))
    model, groups = trainer.model, trainer._optims["DePT"].param_groups
    assert [group["initial_lr"] for group in groups] == [0.0035, pytest.approx(0.0035 * 6.5)]
    names = {id(p): name for name, p in model.named_parameters()}
    prompts = sorted(names[id(p)] for p in groups[0]["params"])
    head = sorted(names[id(p)] for p in groups[1]["params"])
    assert head == ["film_image.scale", "film_image.shift", "film_text.scale", "film_text.shift",
                    "head.bias", "head.weight"]
    assert prompts and all(name.startswith("base.prompt_learner.") for name in prompts)
    assert [group["lr"] for group in groups] == [1e-5, 1e-5]  # the constant warm-up, as upstream


@pytest.mark.parametrize("base", ["CoOp", "MaPLe"])
def test_a_training_step_changes_only_the_prompts_film_and_head(toy_world, tmp_path, base):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.SUBSAMPLE_CLASSES", "base", "TRAINER.DEPT.BASE", base,
                                    "TRAINER.COOP.N_CTX", "4", "OPTIM.WARMUP_EPOCH", "0"))
    model = trainer.model
    learned, _, _ = one_step_changes_only_the_learnable(trainer)
    assert {"film_image.scale", "film_text.shift", "head.weight", "head.bias"} <= learned
    assert all(name.startswith(("base.prompt_learner.", "film_", "head.")) for name in learned)
    assert model.head.weight.shape == (3, 32)  # the toy world's 3 base classes (of 5)


def test_config_errors(toy_world, tmp_path):  # noqa: F811
    cases = [
        (("TRAINER.DEPT.BASE", "CoCoOp"), r"TRAINER\.DEPT\.BASE must be one of \['CoOp', 'MaPLe'\]"),
        (("TRAINER.DEPT.HEAD_WEIGHT", "1.5"), r"TRAINER\.DEPT\.HEAD_WEIGHT must be between 0.0 and 1.0"),
        (("TRAINER.DEPT.HEAD_LR_MULT", "0.0"), r"TRAINER\.DEPT\.HEAD_LR_MULT must be > 0"),
        (("TRAINER.DEPT.INFERENCE", "head"), r"TRAINER\.DEPT\.INFERENCE must be one of \['auto', 'fused', 'sim'\]"),
        (("TRAINER.DEPT.TARGET_FUSION", "name"), r"TRAINER\.DEPT\.TARGET_FUSION must be one of \['upstream', 'off'\]"),
        (("TRAINER.DEPT.PREC", "fp8"), "TRAINER.DEPT.PREC"),
        (("TRAINER.MAPLE.PROMPT_DEPTH", "0"), "PROMPT_DEPTH"),  # the base method's own checks run
    ]
    assert_config_errors(lambda *opts: pets_cfg(toy_world, tmp_path, *opts), cases)


def test_new_classes_load_the_base_run_without_its_head(toy_world, tmp_path, capsys):  # noqa: F811
    trained = build_seeded(pets_cfg(toy_world, tmp_path / "base", "DATASET.SUBSAMPLE_CLASSES", "base"))
    with torch.no_grad():
        trained.model.base.prompt_learner.ctx.add_(1.0)
    trained.save_model(0, str(tmp_path / "run"))
    novel = build_seeded(pets_cfg(toy_world, tmp_path / "new", "DATASET.SUBSAMPLE_CLASSES", "new", "TEST.ROLE", "new"))
    capsys.readouterr()
    novel.load_model(str(tmp_path / "run"), epoch=1)
    assert "Warning" not in capsys.readouterr().out  # no head rows of other classes reported
    torch.testing.assert_close(novel.model.base.prompt_learner.ctx, trained.model.base.prompt_learner.ctx)
    assert novel.model.head is None and novel.classnames != trained.classnames


def trained_source_run(toy_world, tmp_path, subsample):  # noqa: F811
    """A source trainer on the toy pets' ``subsample`` classes with its prompts, FiLM and head moved
    away from their inits, saved as epoch 1 of ``tmp_path / "run"``: (trainer, run folder)."""
    trained = build_seeded(pets_cfg(toy_world, tmp_path / "source", "DATASET.SUBSAMPLE_CLASSES", subsample))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        trained.model.base.prompt_learner.ctx.add_(1.0)
        for parameter in (trained.model.film_image.scale, trained.model.film_image.shift,
                          trained.model.head.weight, trained.model.head.bias):
            parameter.add_(torch.randn(parameter.shape, generator=generator))
    trained.save_model(0, str(tmp_path / "run"))
    return trained, tmp_path / "run"


def target_trainer(toy_world, tmp_path, run, subsample, *opts):  # noqa: F811
    """A target-scope evaluation of the toy pets' ``subsample`` classes that loads ``run``."""
    trainer = build_seeded(pets_cfg(toy_world, tmp_path / "_".join(("target", subsample) + opts), "TEST.ROLE", "target",
                                    "DATASET.SUBSAMPLE_CLASSES", subsample, *opts))
    trainer.load_model(str(run), epoch=1)
    trainer.model.eval()
    return trainer


def similarity_by_hand(model, x):
    """s·f̂·t̂ᵀ [B, C] written out from the base method's features."""
    f = model.base.unnormalised_image_features(x)
    t = model.base.compute_text_features()
    return model.clip.logit_scale.exp() * F.normalize(f, dim=-1) @ F.normalize(t, dim=-1).t()


@pytest.mark.parametrize("subsample", ["all", "new"])  # the source's classes (as V2), a subset in another place (as -A)
def test_a_target_of_source_classes_fuses_the_heads_rows_of_its_classes(toy_world, tmp_path, capsys,  # noqa: F811
                                                                         subsample):
    source, run = trained_source_run(toy_world, tmp_path, "all")
    target = target_trainer(toy_world, tmp_path, run, subsample)
    assert "DePT target fusion: fused" in capsys.readouterr().out
    rows = [source.classnames.index(name) for name in target.classnames]
    assert rows == ([0, 1, 2, 3, 4] if subsample == "all" else [3, 4])
    model, x = target.model, images()
    assert model.inference == "fused"
    with torch.no_grad():
        f = model.base.unnormalised_image_features(x)
        head = ((source.model.film_image.scale * f + source.model.film_image.shift)
                @ source.model.head.weight[rows].t() + source.model.head.bias[rows])
        torch.testing.assert_close(model(x), 0.3 * similarity_by_hand(model, x) + 0.7 * head, **TOL)
        assert (model(x) - similarity_by_hand(model, x)).abs().max() > 1e-2  # the head counts

    off = target_trainer(toy_world, tmp_path, run, subsample, "TRAINER.DEPT.TARGET_FUSION", "off")
    assert off.model.inference == "sim" and off.model.head is None
    assert "DePT target fusion" not in capsys.readouterr().out
    with torch.no_grad():
        torch.testing.assert_close(off.model(x), similarity_by_hand(off.model, x), **TOL)


def test_the_checkpoint_records_the_heads_classes(toy_world, tmp_path):  # noqa: F811
    source, run = trained_source_run(toy_world, tmp_path, "base")
    checkpoint = torch.load(run / "DePT" / "model.pth.tar-1", weights_only=False)
    assert checkpoint["trainer_state"]["head_classnames"] == source.classnames == CLASSNAMES


def test_a_target_with_classes_the_head_was_not_trained_on_uses_the_similarity_only(toy_world, tmp_path,  # noqa: F811
                                                                                     capsys):
    _, run = trained_source_run(toy_world, tmp_path, "base")  # the head knows 3 of the 5 classes
    target = target_trainer(toy_world, tmp_path, run, "all")
    out = capsys.readouterr().out
    assert "DePT target fusion: sim, 2 of the 5 classes of this dataset are not among the head's 3" in out
    assert target.model.inference == "sim" and target.model.head is None
    with torch.no_grad():
        torch.testing.assert_close(target.model(images()), similarity_by_hand(target.model, images()), **TOL)


def test_a_checkpoint_without_head_classes_leaves_a_target_on_the_similarity(toy_world, tmp_path, capsys):  # noqa: F811
    _, run = trained_source_run(toy_world, tmp_path, "all")
    path = run / "DePT" / "model.pth.tar-1"
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["trainer_state"]["head_classnames"]
    torch.save(checkpoint, path)
    target = target_trainer(toy_world, tmp_path, run, "all")
    assert "records no head classes" in capsys.readouterr().out
    assert target.model.inference == "sim" and target.model.head is None
