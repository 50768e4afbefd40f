"""What the official code needs around it in its subprocess (the official trees first on PYTHONPATH).

Nothing here imports the method registry: the method modules use these helpers themselves.
"""
import sys
import types

from .weights import backbone_and_size


def install_stand_ins():
    """Empty modules for what Dassl imports only for logging and for datasets not used here
    (``torch.utils.tensorboard``, ``gdown``, ``wilds``, ``pandas``), and ``pkg_resources``
    (setuptools) holding only ``packaging``, the one name some clip copies import from it."""
    import packaging.version
    import torchvision.ops  # noqa: F401  (imported before the stand-ins: torch._dynamo looks modules up)

    for name, attributes in (("torch.utils.tensorboard", {"SummaryWriter": None}), ("gdown", {}),
                             ("wilds", {"get_dataset": None}), ("pandas", {}),
                             ("pkg_resources", {"packaging": packaging})):
        stand_in = types.ModuleType(name)
        stand_in.__dict__.update(attributes)
        sys.modules[name] = stand_in


def official_setup(spec, backbone, resolution, weights_path):
    """The stand-ins installed, the official ``clip._download`` pointed at ``weights_path``, the
    Dassl config of ``spec`` (its ``official_cfg``, ``backbone``, input size ``resolution``, its
    dataset name, then its ``prepare_official``) and the official module imported.

    Returns:
        (cfg, module, official clip module).
    """
    install_stand_ins()
    import importlib

    from clip import clip as official_clip
    from dassl.config import get_cfg_default
    from yacs.config import CfgNode as CN

    official_clip._download = lambda url, root=None: weights_path
    cfg = get_cfg_default()
    for path, values in spec.official_cfg.items():
        parent = cfg
        for part in path.split(".")[:-1]:
            parent = getattr(parent, part)
        setattr(parent, path.split(".")[-1], CN(values))
    cfg.MODEL.BACKBONE.NAME = backbone_and_size(backbone)[0]
    cfg.INPUT.SIZE = (resolution, resolution)
    cfg.DATASET.NAME = spec.dataset
    if spec.prepare_official is not None:
        spec.prepare_official(cfg, weights_path)
    return cfg, importlib.import_module(spec.official_module), official_clip
