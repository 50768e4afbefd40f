from .transforms import INTERPOLATION_MODES, build_transform

__all__ = ["INTERPOLATION_MODES", "build_transform"]
