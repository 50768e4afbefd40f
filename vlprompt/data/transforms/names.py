"""The names of the input transforms and interpolations: plain data, so that config checks read them
without importing torchvision (the interpolations and resize modes are the backbone preprocessing's,
``vlprompt.clip.preprocess``)."""

UNSUPPORTED_POLICIES = [
    "imagenet_policy",
    "cifar10_policy",
    "svhn_policy",
    "randaugment",
    "randaugment_fixmatch",
    "randaugment2",
]

AVAI_CHOICES = [
    "random_flip",
    "random_resized_crop",
    "normalize",
    "instance_norm",
    "random_crop",
    "random_translation",
    "center_crop",
    "cutout",
    *UNSUPPORTED_POLICIES,
    "gaussian_noise",
    "colorjitter",
    "randomgrayscale",
    "gaussian_blur",
]

# The interpolations, resize modes and preprocessing keys belong to the backbone's preprocessing.
from vlprompt.clip.preprocess import INTERPOLATIONS, RESIZE_MODES  # noqa: E402,F401
