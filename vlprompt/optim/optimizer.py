"""Optimizer construction from ``cfg.OPTIM`` (Dassl ``build_optimizer``)."""
import warnings

import torch
from torch import nn

__all__ = ["AVAI_OPTIMS", "build_optimizer"]

AVAI_OPTIMS = ["adam", "amsgrad", "sgd", "rmsprop", "radam", "adamw"]


def _staged_param_groups(model, optim_cfg):
    """Two groups: children not in NEW_LAYERS at LR * BASE_LR_MULT (group 0), then
    children in NEW_LAYERS at LR (group 1)."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            "With OPTIM.STAGED_LR True, build_optimizer() needs an nn.Module, "
            f"but got {type(model).__name__}"
        )
    if isinstance(model, nn.DataParallel):
        model = model.module
    new_layers = optim_cfg.NEW_LAYERS
    if isinstance(new_layers, str):
        new_layers = [new_layers]
    if not new_layers:
        warnings.warn("OPTIM.STAGED_LR is True but OPTIM.NEW_LAYERS is empty: every layer gets LR * BASE_LR_MULT")
    children = [name for name, _ in model.named_children()]
    unknown = [name for name in new_layers if name not in children]
    if unknown:
        raise ValueError(
            f"OPTIM.NEW_LAYERS names {unknown}, which are not top-level children of the model; "
            f"the children are {children}"
        )
    base_params, new_params = [], []
    for name, module in model.named_children():
        target = new_params if name in new_layers else base_params
        target.extend(module.parameters())
    return [
        {"params": base_params, "lr": optim_cfg.LR * optim_cfg.BASE_LR_MULT},
        {"params": new_params},
    ]


def build_optimizer(model, optim_cfg, param_groups=None):
    """Build the optimizer named by ``optim_cfg.NAME``.

    Args:
        model: an nn.Module (all its parameters; frozen ones are skipped by the step
            since they get no gradient) or an iterable of parameters / param-group dicts.
        optim_cfg (CfgNode): ``cfg.OPTIM``.
        param_groups (list, optional): used as given instead of ``model`` (STAGED_LR is
            then ignored with a warning).

    Returns:
        torch.optim.Optimizer: adam, amsgrad, sgd, rmsprop, radam (torch's RAdam) or adamw.
    """
    name = optim_cfg.NAME
    if name not in AVAI_OPTIMS:
        raise ValueError(f"OPTIM.NAME must be one of {AVAI_OPTIMS}, but got {name!r}")
    lr = optim_cfg.LR
    weight_decay = optim_cfg.WEIGHT_DECAY
    betas = (optim_cfg.ADAM_BETA1, optim_cfg.ADAM_BETA2)

    if param_groups is not None:
        if optim_cfg.STAGED_LR:
            warnings.warn("OPTIM.STAGED_LR is ignored because param_groups were given; put the staged LRs in them")
    elif optim_cfg.STAGED_LR:
        param_groups = _staged_param_groups(model, optim_cfg)
    elif isinstance(model, nn.Module):
        param_groups = model.parameters()
    else:
        param_groups = model

    if name == "adam":
        return torch.optim.Adam(param_groups, lr=lr, weight_decay=weight_decay, betas=betas)
    if name == "amsgrad":
        return torch.optim.Adam(param_groups, lr=lr, weight_decay=weight_decay, betas=betas, amsgrad=True)
    if name == "sgd":
        return torch.optim.SGD(
            param_groups,
            lr=lr,
            momentum=optim_cfg.MOMENTUM,
            weight_decay=weight_decay,
            dampening=optim_cfg.SGD_DAMPNING,
            nesterov=optim_cfg.SGD_NESTEROV,
        )
    if name == "rmsprop":
        return torch.optim.RMSprop(
            param_groups,
            lr=lr,
            momentum=optim_cfg.MOMENTUM,
            weight_decay=weight_decay,
            alpha=optim_cfg.RMSPROP_ALPHA,
        )
    if name == "radam":
        return torch.optim.RAdam(param_groups, lr=lr, weight_decay=weight_decay, betas=betas)
    return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay, betas=betas)
