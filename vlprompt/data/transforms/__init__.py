"""Input transforms (Dassl's names). The torchvision-backed builders are imported on first use,
so that reading the transform names (``names``) does not import torchvision."""
__all__ = ["INTERPOLATION_MODES", "build_transform"]


def __getattr__(name):
    if name in __all__:
        from . import transforms

        return getattr(transforms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
