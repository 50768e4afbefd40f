"""Optimizers and LR schedules (Dassl's), including exact resumption."""
import copy
import io
import warnings

import pytest
import torch
from torch import nn

from vlprompt.config import get_cfg_default
from vlprompt.optim import (
    ConstantWarmupScheduler,
    LinearWarmupScheduler,
    build_lr_scheduler,
    build_optimizer,
)

# Dassl's learning rates, verified (SGD, base lr 0.002, one step per epoch): lr of epochs 1, 2, ...
VERIFIED = {
    "cosine5_constant1": (
        dict(MAX_EPOCH=5, WARMUP_EPOCH=1, WARMUP_TYPE="constant"),
        [1e-05, 0.002, 0.00180902, 0.00130902, 0.000690983],
    ),
    "cosine10_constant1": (
        dict(MAX_EPOCH=10, WARMUP_EPOCH=1, WARMUP_TYPE="constant"),
        [1e-05, 0.002, 0.00195106, 0.00180902, 0.00158779, 0.00130902, 0.001, 0.000690983, 0.000412215,
         0.000190983],
    ),
    "cosine4_constant2": (
        dict(MAX_EPOCH=4, WARMUP_EPOCH=2, WARMUP_TYPE="constant"),
        [1e-05, 1e-05, 0.002, 0.00170711],
    ),
    "cosine5_linear2": (
        dict(MAX_EPOCH=5, WARMUP_EPOCH=2, WARMUP_TYPE="linear"),
        [1e-05, 0.001, 0.002, 0.00180902, 0.00130902],
    ),
    "cosine5_constant1_no_recount": (
        dict(MAX_EPOCH=5, WARMUP_EPOCH=1, WARMUP_TYPE="constant", WARMUP_RECOUNT=False),
        [1e-05, 0.002, 0.00144721, 0.000763932, 0.000211146],
    ),
    "cosine5_no_warmup": (
        dict(MAX_EPOCH=5),
        [0.002, 0.00180902, 0.00130902, 0.000690983, 0.000190983],
    ),
    "cosine2_constant1": (
        dict(MAX_EPOCH=2, WARMUP_EPOCH=1, WARMUP_TYPE="constant"),
        [1e-05, 0.002],
    ),
}


def _optim_cfg(**overrides):
    cfg = get_cfg_default().OPTIM
    cfg.NAME = "sgd"
    cfg.LR = 0.002
    cfg.LR_SCHEDULER = "cosine"
    cfg.WARMUP_CONS_LR = 1e-5
    cfg.WARMUP_MIN_LR = 1e-5
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def _build(optim_cfg):
    """A fixed 4 -> 2 linear model with its optimizer and scheduler."""
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.arange(8.0).view(2, 4) / 10)
        model.bias.fill_(0.5)
    optimizer = build_optimizer(model, optim_cfg)
    return model, optimizer, build_lr_scheduler(optimizer, optim_cfg)


def _run_epochs(model, optimizer, scheduler, epochs):
    """One optimizer step per epoch (deterministic gradient), then one scheduler step;
    returns the lr in effect during each epoch."""
    lrs = []
    for _ in range(epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        (model(torch.ones(1, 4)) ** 2).sum().backward()
        optimizer.step()
        scheduler.step()
    return lrs


def _through_file(obj, weights_only=True):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=weights_only)


@pytest.mark.parametrize("case", sorted(VERIFIED))
def test_verified_lr_sequences(case):
    overrides, expected = VERIFIED[case]
    model, optimizer, scheduler = _build(_optim_cfg(**overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scheduler-order or deprecation warnings
        lrs = _run_epochs(model, optimizer, scheduler, len(expected))
    assert lrs == pytest.approx(expected, abs=1e-8)


@pytest.mark.parametrize("case", sorted(VERIFIED))
def test_resume_after_epoch_2_continues_bit_identically(case):
    overrides, expected = VERIFIED[case]
    cfg = _optim_cfg(**overrides)
    model, optimizer, scheduler = _build(cfg)
    uninterrupted = _run_epochs(model, optimizer, scheduler, len(expected))
    final_weight = model.weight.detach().clone()

    model, optimizer, scheduler = _build(cfg)
    first = _run_epochs(model, optimizer, scheduler, 2)
    saved = _through_file(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    )

    model, optimizer, scheduler = _build(cfg)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    rest = _run_epochs(model, optimizer, scheduler, len(expected) - 2)

    assert first + rest == uninterrupted
    assert torch.equal(model.weight, final_weight)


def test_warmup_state_dict_holds_the_successor_state_not_the_object():
    _, _, scheduler = _build(_optim_cfg(MAX_EPOCH=5, WARMUP_EPOCH=1, WARMUP_TYPE="constant"))
    state = scheduler.state_dict()
    assert isinstance(scheduler, ConstantWarmupScheduler)
    assert state["successor"] == scheduler.successor.state_dict()
    assert state["warmup_epoch"] == 1 and state["cons_lr"] == 1e-5
    assert "optimizer" not in state


def test_dassl_format_state_with_pickled_successor_resumes_the_live_optimizer():
    """Dassl stores the successor object; loading it must not freeze the lr."""
    cfg = _optim_cfg(MAX_EPOCH=6, WARMUP_EPOCH=1, WARMUP_TYPE="constant")
    model, optimizer, scheduler = _build(cfg)
    uninterrupted = _run_epochs(model, optimizer, scheduler, 6)

    model, optimizer, scheduler = _build(cfg)
    first = _run_epochs(model, optimizer, scheduler, 3)
    dassl_state = scheduler.state_dict()
    dassl_state["successor"] = copy.deepcopy(scheduler.successor)  # object with its own optimizer copy
    dassl_state["verbose"] = False
    saved = _through_file(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": dassl_state},
        weights_only=False,
    )

    model, optimizer, scheduler = _build(cfg)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    rest = _run_epochs(model, optimizer, scheduler, 3)
    assert first + rest == uninterrupted
    assert rest[0] > rest[1] > rest[2]  # still following the cosine, not frozen


def test_dassl_format_state_of_another_scheduler_type_is_rejected():
    _, optimizer, scheduler = _build(_optim_cfg(MAX_EPOCH=5, WARMUP_EPOCH=1, WARMUP_TYPE="constant"))
    state = scheduler.state_dict()
    state["successor"] = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    with pytest.raises(ValueError, match="checkpoint's scheduler after warm-up is StepLR, but the configured one is CosineAnnealingLR"):
        scheduler.load_state_dict(state)


def test_linear_warmup_type_and_unknown_warmup_type():
    _, _, scheduler = _build(_optim_cfg(MAX_EPOCH=5, WARMUP_EPOCH=2, WARMUP_TYPE="linear"))
    assert isinstance(scheduler, LinearWarmupScheduler)
    with pytest.raises(ValueError, match="WARMUP_TYPE must be \"constant\" or \"linear\", but got 'cubic'"):
        _build(_optim_cfg(WARMUP_EPOCH=1, WARMUP_TYPE="cubic"))


def test_step_schedulers():
    model, optimizer, scheduler = _build(_optim_cfg(LR_SCHEDULER="single_step", STEPSIZE=(2,), GAMMA=0.5))
    assert _run_epochs(model, optimizer, scheduler, 5) == pytest.approx([0.002, 0.002, 0.001, 0.001, 0.0005])
    model, optimizer, scheduler = _build(_optim_cfg(LR_SCHEDULER="single_step", STEPSIZE=(-1,), MAX_EPOCH=3))
    assert _run_epochs(model, optimizer, scheduler, 4) == pytest.approx([0.002, 0.002, 0.002, 0.0002])
    model, optimizer, scheduler = _build(_optim_cfg(LR_SCHEDULER="multi_step", STEPSIZE=(1, 3), GAMMA=0.1))
    assert _run_epochs(model, optimizer, scheduler, 4) == pytest.approx([0.002, 0.0002, 0.0002, 0.00002])


def test_scheduler_errors():
    with pytest.raises(ValueError, match=r"LR_SCHEDULER must be one of \['single_step', 'multi_step', 'cosine'\], but got 'poly'"):
        _build(_optim_cfg(LR_SCHEDULER="poly"))
    with pytest.raises(TypeError, match="STEPSIZE must be an int"):
        _build(_optim_cfg(LR_SCHEDULER="single_step", STEPSIZE=(2.5,)))
    with pytest.raises(TypeError, match="STEPSIZE must be a list/tuple"):
        _build(_optim_cfg(LR_SCHEDULER="multi_step", STEPSIZE=3))


@pytest.mark.parametrize(
    "name, cls, expected",
    [
        ("sgd", torch.optim.SGD, dict(momentum=0.9, weight_decay=5e-4, dampening=0, nesterov=False)),
        ("adam", torch.optim.Adam, dict(betas=(0.9, 0.999), weight_decay=5e-4, amsgrad=False)),
        ("amsgrad", torch.optim.Adam, dict(betas=(0.9, 0.999), amsgrad=True)),
        ("rmsprop", torch.optim.RMSprop, dict(alpha=0.99, momentum=0.9)),
        ("radam", torch.optim.RAdam, dict(betas=(0.9, 0.999), weight_decay=5e-4)),
        ("adamw", torch.optim.AdamW, dict(betas=(0.9, 0.999), weight_decay=5e-4)),
    ],
)
def test_build_optimizer_names_and_hyperparameters(name, cls, expected):
    optimizer = build_optimizer(nn.Linear(2, 2), _optim_cfg(NAME=name))
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.002
    for key, value in expected.items():
        assert group[key] == value, key


def test_unknown_optimizer_lists_the_names():
    with pytest.raises(ValueError) as info:
        build_optimizer(nn.Linear(2, 2), _optim_cfg(NAME="lion"))
    assert str(info.value) == (
        "OPTIM.NAME must be one of ['adam', 'amsgrad', 'sgd', 'rmsprop', 'radam', 'adamw'], but got 'lion'"
    )


class TwoPart(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)


def test_staged_lr_groups():
    model = TwoPart()
    optimizer = build_optimizer(
        nn.DataParallel(model), _optim_cfg(STAGED_LR=True, NEW_LAYERS=("head",), BASE_LR_MULT=0.1)
    )
    base, new = optimizer.param_groups
    assert base["lr"] == pytest.approx(0.0002) and new["lr"] == 0.002
    assert base["params"] == list(model.backbone.parameters())
    assert new["params"] == list(model.head.parameters())
    with pytest.raises(ValueError, match=r"NEW_LAYERS names \['heads'\].*children are \['backbone', 'head'\]"):
        build_optimizer(model, _optim_cfg(STAGED_LR=True, NEW_LAYERS=("heads",)))


def test_param_groups_override_model_and_staged_lr():
    model = TwoPart()
    groups = [{"params": model.head.parameters(), "lr": 0.1}]
    with pytest.warns(UserWarning, match="STAGED_LR is ignored"):
        optimizer = build_optimizer(model, _optim_cfg(STAGED_LR=True, NEW_LAYERS=("head",)), param_groups=groups)
    assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["lr"] == 0.1
    optimizer = build_optimizer(list(model.head.parameters()), _optim_cfg())
    assert optimizer.param_groups[0]["params"] == list(model.head.parameters())


def test_star_import_exposes_optim_names():
    namespace = {}
    exec("from vlprompt.optim import *", namespace)
    assert {"build_optimizer", "build_lr_scheduler"} <= set(namespace)
