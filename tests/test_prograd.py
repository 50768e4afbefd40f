"""ProGrad: the CE gradient projected against the zero-shot KL direction, per parameter tensor."""
import pytest
import torch
import torch.nn.functional as F
from baseline_setup import build_seeded, frozen, learnable, make_cfg, toy_world  # noqa: F401
from torch import nn

from trainers.prograd import ProGrad, project_conflicting, soft_cross_entropy, template_for
from vlprompt.config import ConfigError
from vlprompt.engine.amp import MixedPrecision

PETS_PHRASE = "a type of pet, a photo of a"


def prograd_cfg(toy_world, tmp_path, **node):  # noqa: F811
    """The toy OxfordPets world (3 base classes, batch 4) with a ProGrad node, no warm-up."""
    base = make_cfg(toy_world, "KgCoOp", tmp_path, OPTIM__WARMUP_EPOCH=0, OPTIM__LR=0.5)
    cfg = base.clone()
    cfg.defrost()
    cfg.TRAINER.NAME = "ProGrad"
    settings = {"N_CTX": 10, "CTX_INIT": True, "PREC": "fp32", "LAMBDA": 1.0, "T": 1.0, **node}
    for name, value in settings.items():
        cfg.TRAINER.PROGRAD[name] = value
    cfg.freeze()
    return cfg


# -- the projection rule on hand-built gradients ------------------------------------------------


def test_conflicting_gradient_loses_its_component_along_the_zero_shot_direction():
    g_d, g_g = torch.tensor([1.0, 0.0]), torch.tensor([-2.0, 2.0])
    projected = project_conflicting(g_d, g_g, 1.0)
    torch.testing.assert_close(projected, torch.tensor([0.5, 0.5]))
    assert abs(float(projected @ g_g)) < 1e-6  # λ = 1: orthogonal to ĝ_g
    torch.testing.assert_close(project_conflicting(g_d, g_g, 0.5), torch.tensor([0.75, 0.25]))


def test_agreeing_orthogonal_or_zero_direction_leaves_the_gradient_unchanged():
    g_d = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    for g_g in (g_d * 0.1 + torch.tensor([[0.0, 0.0], [1.0, 0.0]]), torch.tensor([[2.0, 1.0], [0.0, 0.0]]),
                torch.zeros(2, 2)):
        assert float((g_d * g_g).sum()) >= 0
        torch.testing.assert_close(project_conflicting(g_d, g_g, 1.0), g_d)


def test_projection_on_random_tensors_matches_the_formula_and_is_scale_equivariant():
    torch.manual_seed(0)
    g_d, g_g = torch.randn(16, 8), torch.randn(16, 8)
    if float((g_d * g_g).sum()) > 0:
        g_g = -g_g
    unit = g_g / g_g.norm()
    expected = g_d - 0.8 * (g_d * unit).sum() * unit
    projected = project_conflicting(g_d, g_g, 0.8)
    torch.testing.assert_close(projected, expected)
    assert abs(float((project_conflicting(g_d, g_g, 1.0) * unit).sum())) < 1e-5
    # A GradScaler multiplies both losses by s: the result is s times the unscaled one.
    torch.testing.assert_close(project_conflicting(1024.0 * g_d, 1024.0 * g_g, 0.8), 1024.0 * projected)


def test_an_overflowing_zero_shot_gradient_gives_a_non_finite_result():
    g_d, g_g = torch.tensor([1.0, 0.0]), torch.tensor([float("inf"), 1.0])
    assert not torch.isfinite(project_conflicting(g_d, g_g, 1.0)).all()


# -- the update step, per parameter tensor ---------------------------------------------------------


def bare_trainer(params, lam, scaler=None):
    """A ProGrad instance holding only what its update step reads: one SGD (lr 1) over ``params``."""
    trainer = object.__new__(ProGrad)
    module = nn.ParameterList(params)
    trainer._models = {"learner": module}
    trainer._optims = {"learner": torch.optim.SGD(module.parameters(), lr=1.0)}
    trainer._scheds = {"learner": None}
    trainer.amp = MixedPrecision("fp32", torch.device("cpu"))
    trainer.amp.scaler = scaler
    trainer.nonfinite_loss, trainer.nonfinite_steps, trainer._step_skipped = "stop", 0, False
    trainer.last_checkpoint = None
    trainer.cfg = type("Cfg", (), {"TRAINER": type("T", (), {"PROGRAD": type("P", (), {"LAMBDA": lam})})})()
    return trainer, module


def hand_built_step(scaler=None):
    """Two tensors: a's CE gradient [1, 0] conflicts with its KL gradient [-1, 1]; b's [0, 2] agrees with [0, 1]."""
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    trainer, _ = bare_trainer([a, b], 1.0, scaler)
    loss_ce = a @ torch.tensor([1.0, 0.0]) + b @ torch.tensor([0.0, 2.0])
    loss_kl = a @ torch.tensor([-1.0, 1.0]) + b @ torch.tensor([0.0, 1.0])
    trainer.prograd_backward_and_update(loss_ce, loss_kl, terms={})
    return a.detach(), b.detach()


def test_one_step_projects_each_tensor_on_its_own_and_steps_once():
    a, b = hand_built_step()
    torch.testing.assert_close(a, -torch.tensor([0.5, 0.5]))  # projected
    torch.testing.assert_close(b, -torch.tensor([0.0, 2.0]))  # unchanged CE gradient
    # One projection over the concatenated gradient would have left a's conflict in place:
    # ⟨[1,0,0,2], [-1,1,0,1]⟩ = 1 > 0.


def test_a_grad_scaler_gives_the_same_step_as_no_scaling():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    a, b = hand_built_step(scaler)
    torch.testing.assert_close(a, -torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(b, -torch.tensor([0.0, 2.0]))


def test_non_finite_kl_loss_goes_through_the_engine_check():
    a = nn.Parameter(torch.zeros(2))
    trainer, _ = bare_trainer([a], 1.0)
    with pytest.raises(FloatingPointError, match="Loss is infinite or NaN"):
        trainer.prograd_backward_and_update(a.sum(), a.sum() + float("nan"), terms={})
    trainer.nonfinite_loss = "skip"
    trainer.prograd_backward_and_update(a.sum(), a.sum() + float("inf"), terms={})
    assert trainer.nonfinite_steps == 1 and torch.equal(a.detach(), torch.zeros(2))


# -- the trainer on the toy OxfordPets world -------------------------------------------------------


def test_context_starts_with_zeros_then_the_template_words(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(prograd_cfg(toy_world, tmp_path))
    learner, model = trainer.model.prompt_learner, trainer.model
    words = len(PETS_PHRASE.split(" "))
    assert torch.equal(learner.ctx[: 10 - words], torch.zeros(10 - words, learner.ctx.shape[1]))
    tokenizer = learner.tokenizer
    name = trainer.classnames[0]
    with torch.no_grad():
        full = model.clip.text.embed(tokenizer(["X " * (10 - words) + PETS_PHRASE + f" {name}."]))[0].float()
        phrase = model.clip.text.embed(tokenizer([PETS_PHRASE]))[0, 1 : 1 + words].float()
        prompts = learner()[0]
    torch.testing.assert_close(learner.ctx[10 - words :], phrase)
    # The prompt is the template sentence with the first n - w slots zero (its rest in the suffix).
    torch.testing.assert_close(prompts[1 + 10 - words :], full[1 + 10 - words :])
    torch.testing.assert_close(prompts[0], full[0])
    zs_sentences = tokenizer([f"a type of pet, a photo of a {n}." for n in trainer.classnames])
    with torch.no_grad():
        expected = F.normalize(model.clip.encode_text(zs_sentences).float(), dim=-1)
    torch.testing.assert_close(model.zs_text_features, expected, rtol=1e-5, atol=1e-5)


def independent_update(trainer, images, labels, lam):
    """ctx after one step, re-computed with plain autograd from the paper's equations."""
    model = trainer.model
    ctx = model.prompt_learner.ctx
    image_features = F.normalize(model.clip.encode_image(images), dim=-1)
    text_features = F.normalize(model.compute_text_features(), dim=-1)
    logits = model.logit_scale * image_features @ text_features.t()
    zs = (model.logit_scale * image_features @ model.zs_text_features.t()).detach()
    loss_ce = F.cross_entropy(logits, labels)
    loss_kl = -(F.softmax(zs, dim=-1) * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    (g_g,) = torch.autograd.grad(loss_kl, ctx, retain_graph=True)
    (g_d,) = torch.autograd.grad(loss_ce, ctx)
    unit = g_g / g_g.norm()
    dot = float((g_d * unit).sum())
    grad = g_d - lam * dot * unit if dot < 0 else g_d
    group = trainer._optims["prompt_learner"].param_groups[0]
    grad = grad + group["weight_decay"] * ctx.detach()  # SGD's first step: momentum buffer = gradient
    return (ctx.detach() - group["lr"] * grad), dot, float(loss_kl.detach())


# Perturbation seeds whose first batch has conflicting (⟨g_d, ĝ_g⟩ < 0) or agreeing gradients.
@pytest.mark.parametrize("lam,seed,conflicting", [(1.0, 0, True), (0.5, 6, True), (1.0, 1, False)])
def test_training_step_equals_an_independent_recomputation(toy_world, tmp_path, lam, seed, conflicting):  # noqa: F811
    trainer = build_seeded(prograd_cfg(toy_world, tmp_path, LAMBDA=lam))
    torch.manual_seed(seed)
    with torch.no_grad():  # move away from the zero-shot prompt so that the KL term is active
        trainer.model.prompt_learner.ctx.add_(0.5 * torch.randn_like(trainer.model.prompt_learner.ctx))
    batch = next(iter(trainer.train_loader_x))
    images, labels = trainer.parse_batch_train(batch)
    expected, dot, kl = independent_update(trainer, images, labels, lam)
    assert (dot < 0) == conflicting and kl > 1e-3
    frozen_before, learnable_before = frozen(trainer.model), learnable(trainer.model)
    trainer.batch_idx, trainer.num_batches, trainer.epoch = 0, 2, 0
    summary = trainer.forward_backward(batch)
    assert list(learnable_before) == ["prompt_learner.ctx"]
    after = trainer.model.prompt_learner.ctx.detach()
    assert not torch.equal(after, learnable_before["prompt_learner.ctx"])
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-6)
    for name, value in frozen(trainer.model).items():
        assert torch.equal(value, frozen_before[name]), name
    assert summary["kl_loss"] == pytest.approx(kl, rel=1e-4)


def test_objective_is_the_cross_entropy_alone(toy_world, tmp_path):  # noqa: F811
    """With λ = 0 the step is plain CoOp's CE step although the KL term is non-zero."""
    trainer = build_seeded(prograd_cfg(toy_world, tmp_path, LAMBDA=0.0))
    ctx = trainer.model.prompt_learner.ctx
    torch.manual_seed(0)  # a batch whose gradients conflict (see above)
    with torch.no_grad():
        ctx.add_(0.5 * torch.randn_like(ctx))
    batch = next(iter(trainer.train_loader_x))
    images, labels = trainer.parse_batch_train(batch)
    loss_ce, loss_kl, _ = trainer.model.losses(images, labels)
    (g_ce,) = torch.autograd.grad(loss_ce, ctx)
    assert float(loss_kl.detach()) > 1e-3
    group = trainer._optims["prompt_learner"].param_groups[0]
    expected = ctx.detach() - group["lr"] * (g_ce + group["weight_decay"] * ctx.detach())
    trainer.batch_idx, trainer.num_batches, trainer.epoch = 0, 2, 0
    trainer.forward_backward(batch)
    torch.testing.assert_close(ctx.detach(), expected, rtol=1e-4, atol=1e-6)


def test_soft_cross_entropy_scales_with_the_squared_temperature():
    logits, target = torch.randn(3, 5), torch.randn(3, 5)
    at_t = soft_cross_entropy(logits, target, 2.0)
    expected = -(F.softmax(target / 2, -1) * F.log_softmax(logits / 2, -1)).sum(-1).mean() * 4
    torch.testing.assert_close(at_t, expected)


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key,value,message", [
    ("LAMBDA", -0.5, "TRAINER.PROGRAD.LAMBDA"),
    ("T", 0.0, "TRAINER.PROGRAD.T"),
    ("PREC", "fp8", "TRAINER.PROGRAD.PREC"),
    ("CLASS_TOKEN_POSITION", "left", "TRAINER.PROGRAD.CLASS_TOKEN_POSITION"),
    ("N_CTX", 0, "TRAINER.PROGRAD.N_CTX"),
    ("CTX_INIT", "a photo of a", "TRAINER.PROGRAD.CTX_INIT"),
    ("CSC", "yes", "TRAINER.PROGRAD.CSC"),
    ("N_CTX", 5, "at least the number of words"),  # the pets prefix has 8 words
])
def test_bad_config_values_are_config_errors(toy_world, tmp_path, key, value, message):  # noqa: F811
    with pytest.raises(ConfigError, match=message):
        build_seeded(prograd_cfg(toy_world, tmp_path, **{key: value}))


def test_template_table_and_its_error():
    assert template_for("OxfordPets", "a photo of a {}, a type of pet.") == PETS_PHRASE + " {}."
    assert template_for("Synthetic", "a photo of a {}.") == "a photo of a {}."
    with pytest.raises(ConfigError, match=r'"MyData".*PROGRAD_TEMPLATES in vlprompt/methods/prograd_templates.py'):
        template_for("MyData", "a photo of a {}, a type of thing.")
