"""The names of the input transforms and interpolations: plain data, so that config checks read them
without importing torchvision."""

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

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")

# How the test transform brings an image to INPUT.SIZE (INPUT.RESIZE_MODE; open_clip's resize modes):
# "shortest" resizes the shorter edge to max(INPUT.SIZE) and takes the center crop (CLIP's preprocessing),
# "squash" resizes to INPUT.SIZE without keeping the aspect ratio (SigLIP, PE-Core), "longest" resizes the
# longer edge to max(INPUT.SIZE) and pads the rest with black.
RESIZE_MODES = ("shortest", "squash", "longest")

# The image preprocessing keys that default to empty ("the backbone's"; vlprompt.clip.preprocess).
PREPROCESS_KEYS = ("SIZE", "INTERPOLATION", "PIXEL_MEAN", "PIXEL_STD", "RESIZE_MODE")

# Their values when no backbone is named (MODEL.BACKBONE.NAME empty): Dassl's defaults.
NO_BACKBONE_PREPROCESS = {
    "SIZE": (224, 224),
    "INTERPOLATION": "bilinear",
    "PIXEL_MEAN": [0.485, 0.456, 0.406],
    "PIXEL_STD": [0.229, 0.224, 0.225],
    "RESIZE_MODE": "shortest",
}
