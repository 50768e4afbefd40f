"""Image transforms built from INPUT.* keys (Dassl's), with Dassl's log lines.

The preprocessing keys (INPUT.SIZE, INTERPOLATION, PIXEL_MEAN, PIXEL_STD, RESIZE_MODE) are the
backbone's where a config leaves them empty: ``build_transform`` resolves them first
(:func:`vlprompt.clip.preprocess.resolve_input`) unless the caller already did. INPUT.RESIZE_MODE
chooses how the test transform reaches INPUT.SIZE (names.RESIZE_MODES); the training transform's
plain resize is to INPUT.SIZE, as Dassl's.

All random choices made by the transforms defined here draw from torch's
generator (torchvision's random transforms do too), so seeding torch, or
restoring a checkpointed torch RNG state, reproduces the augmentation; in
DataLoader workers torch seeds each worker from the loader's base seed.

Speed: a training transform whose random flip is followed only by the tensor conversion and
normalisation flips the normalised tensor instead of the image (the same pixels and the same
draw from torch's generator: both steps act on each pixel alone), so that everything before the
flip is deterministic; ``split_deterministic`` gives that deterministic start of a transform,
whose output the data loader's dataset keeps per image (``vlprompt.data.data_manager``).
"""
import numpy as np
import torch
from PIL import Image
from torchvision.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    GaussianBlur,
    InterpolationMode,
    Normalize,
    RandomApply,
    RandomCrop,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)
from torchvision.transforms import functional as F

from .names import AVAI_CHOICES, INTERPOLATIONS, RESIZE_MODES, UNSUPPORTED_POLICIES

INTERPOLATION_MODES = {name: InterpolationMode[name.upper()] for name in INTERPOLATIONS}


class Random2DTranslation:
    """With probability p, enlarge a PIL image by 1.125 and crop a random (height, width) window;
    otherwise resize it to (height, width).

    Args:
        height, width (int): output size.
        p (float): probability of the translation.
        interpolation (InterpolationMode): resampling filter.
    """

    def __init__(self, height, width, p=0.5, interpolation=InterpolationMode.BILINEAR):
        self.height = height
        self.width = width
        self.p = p
        self.interpolation = interpolation

    def __call__(self, img):
        if torch.rand(1).item() > self.p:
            return F.resize(img, [self.height, self.width], self.interpolation)
        new_height = int(round(self.height * 1.125))
        new_width = int(round(self.width * 1.125))
        resized = F.resize(img, [new_height, new_width], self.interpolation)
        top = int(torch.randint(0, new_height - self.height + 1, (1,)).item())
        left = int(torch.randint(0, new_width - self.width + 1, (1,)).item())
        return F.crop(resized, top, left, self.height, self.width)


class ResizeLongestEdge:
    """Resize a PIL image so that its longer edge is ``length``, keeping the aspect ratio.

    Args:
        length (int): the longer edge after resizing.
        interpolation (InterpolationMode): resampling filter.
    """

    def __init__(self, length, interpolation=InterpolationMode.BICUBIC):
        self.length = length
        self.interpolation = interpolation

    def __call__(self, img):
        width, height = img.size
        scale = self.length / max(width, height)
        size = [max(1, round(height * scale)), max(1, round(width * scale))]
        return F.resize(img, size, self.interpolation)


class ImageToTensor(ToTensor):
    """torchvision's ToTensor with a shorter path for 8-bit RGB PIL images (the same values and
    layout: a contiguous [3, H, W] float tensor of the pixels divided by 255)."""

    def __call__(self, pic):
        if not isinstance(pic, Image.Image) or pic.mode != "RGB":
            return super().__call__(pic)
        pixels = torch.from_numpy(np.array(pic, dtype=np.uint8))  # [H, W, 3], a writable copy
        return pixels.permute(2, 0, 1).contiguous().to(dtype=torch.get_default_dtype()).div(255)


class ChannelNormalize(Normalize):
    """torchvision's Normalize with its mean and std tensors made once per dtype and device (the
    same values: ``(tensor - mean) / std`` per channel)."""

    def __init__(self, mean, std, inplace=False):
        super().__init__(mean, std, inplace)
        self._stats = {}

    def forward(self, tensor):
        if not torch.is_tensor(tensor) or not tensor.is_floating_point() or tensor.ndim < 3:
            return super().forward(tensor)  # torchvision's checks and messages
        key = (tensor.dtype, tensor.device)
        if key not in self._stats:
            std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device)
            mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device)
            self._stats[key] = None if (std == 0).any() or mean.ndim > 1 or std.ndim > 1 else (
                mean.view(-1, 1, 1), std.view(-1, 1, 1))
        if self._stats[key] is None:
            return super().forward(tensor)
        mean, std = self._stats[key]
        return (tensor.sub_(mean) if self.inplace else tensor.sub(mean)).div_(std)


class Cutout:
    """Zero `n_holes` square patches of side `length` centred at random pixels (clipped at borders).

    Input and output: float tensor of shape (C, H, W).
    """

    def __init__(self, n_holes=1, length=16):
        self.n_holes = n_holes
        self.length = length

    def __call__(self, img):
        _, height, width = img.shape
        mask = torch.ones(height, width, dtype=img.dtype)
        half = self.length // 2
        for _ in range(self.n_holes):
            y = int(torch.randint(0, height, (1,)).item())
            x = int(torch.randint(0, width, (1,)).item())
            mask[max(y - half, 0) : min(y + half, height), max(x - half, 0) : min(x + half, width)] = 0
        return img * mask


class GaussianNoise:
    """With probability p, add N(mean, std²) noise to a (C, H, W) tensor."""

    def __init__(self, mean=0.0, std=0.15, p=0.5):
        self.mean = mean
        self.std = std
        self.p = p

    def __call__(self, img):
        if torch.rand(1).item() > self.p:
            return img
        return img + torch.randn(img.shape) * self.std + self.mean


class InstanceNormalization:
    """Normalise each channel of a (C, H, W) tensor by its own mean and standard deviation."""

    def __init__(self, eps=1e-8):
        self.eps = eps

    def __call__(self, img):
        channels = img.shape[0]
        flat = img.reshape(channels, -1)
        mean = flat.mean(1).view(channels, 1, 1)
        std = flat.std(1).view(channels, 1, 1)
        return (img - mean) / (std + self.eps)


# Steps whose output depends on their input alone (no random draw), exact classes only (a subclass
# may draw).
DETERMINISTIC_STEPS = (Resize, CenterCrop, ResizeLongestEdge, ToTensor, ImageToTensor, Normalize, ChannelNormalize,
                       InstanceNormalization)


def split_deterministic(tfm, deterministic=DETERMINISTIC_STEPS):
    """Split a transform into its deterministic leading steps and the rest.

    Args:
        tfm: a callable, or a Compose (nested Compose steps are looked into).
        deterministic: the step classes that draw nothing (exact types).

    Returns:
        (first, rest): callables or None, with ``rest(first(x)) == tfm(x)`` (None is the identity).
    """
    steps = _flat_steps(tfm)
    count = 0
    while count < len(steps) and type(steps[count]) in deterministic:
        count += 1
    first = Compose(steps[:count]) if count else None
    rest = None if count == len(steps) else (tfm if count == 0 else Compose(steps[count:]))
    return first, rest


def _flat_steps(tfm):
    if isinstance(tfm, Compose):
        return [step for each in tfm.transforms for step in _flat_steps(each)]
    return [tfm]


def _check_choices(cfg, choices):
    invalid = [c for c in choices if c not in AVAI_CHOICES]
    if invalid:
        raise ValueError(f"INPUT.TRANSFORMS has unknown transform(s) {invalid}; valid names are {AVAI_CHOICES}.")
    unsupported = [c for c in choices if c in UNSUPPORTED_POLICIES]
    if unsupported:
        raise NotImplementedError(
            f"INPUT.TRANSFORMS asks for {unsupported}: Dassl's AutoAugment / RandAugment policies "
            f"({', '.join(UNSUPPORTED_POLICIES)}) are not implemented in vlprompt; remove them from "
            "INPUT.TRANSFORMS or pass a custom transform to DataManager."
        )
    if cfg.INPUT.INTERPOLATION not in INTERPOLATION_MODES:
        raise ValueError(
            f'INPUT.INTERPOLATION is "{cfg.INPUT.INTERPOLATION}"; valid values are {list(INTERPOLATION_MODES)}.'
        )
    if cfg.INPUT.RESIZE_MODE not in RESIZE_MODES:
        raise ValueError(f'INPUT.RESIZE_MODE is "{cfg.INPUT.RESIZE_MODE}"; valid values are {list(RESIZE_MODES)}.')


def build_transform(cfg, is_train=True, choices=None):
    """Build the training or test transform from the config.

    Args:
        cfg (CfgNode): reads INPUT.* (empty preprocessing keys: the backbone's, resolved here and
            printed if the caller has not resolved them).
        is_train (bool): training (augmenting) or test transform.
        choices (list[str] | None): overrides INPUT.TRANSFORMS.

    Returns:
        Compose mapping a PIL image to a float tensor of shape (3, H, W) with
        (H, W) = INPUT.SIZE, or None if INPUT.NO_TRANSFORM.
    """
    if cfg.INPUT.NO_TRANSFORM:
        print("Note: no transform is applied!")
        return None
    from vlprompt.clip.preprocess import resolved_input

    cfg = resolved_input(cfg)
    if choices is None:
        choices = cfg.INPUT.TRANSFORMS
    _check_choices(cfg, choices)

    target_size = f"{cfg.INPUT.SIZE[0]}x{cfg.INPUT.SIZE[1]}"
    normalize = ChannelNormalize(mean=cfg.INPUT.PIXEL_MEAN, std=cfg.INPUT.PIXEL_STD)
    if is_train:
        return _build_transform_train(cfg, choices, target_size, normalize)
    return _build_transform_test(cfg, choices, target_size, normalize)


# The training choices that let a random flip act last: steps before it (and "center_crop", which
# the training transform does not use) and the normalisation. Any other step after the flip draws
# random numbers (after the flip's draw) or mixes pixels (a flip would change the order of a sum).
FLIP_LAST_CHOICES = {"random_crop", "random_resized_crop", "random_translation", "center_crop", "random_flip",
                     "normalize"}


def _build_transform_train(cfg, choices, target_size, normalize):
    print("Building transform_train")
    steps = []
    interpolation = INTERPOLATION_MODES[cfg.INPUT.INTERPOLATION]
    input_size = cfg.INPUT.SIZE

    if "random_crop" not in choices and "random_resized_crop" not in choices:
        print(f"+ resize to {target_size}")
        steps.append(Resize(input_size, interpolation=interpolation))

    if "random_translation" in choices:
        print("+ random translation")
        steps.append(Random2DTranslation(input_size[0], input_size[1]))

    if "random_crop" in choices:
        padding = cfg.INPUT.CROP_PADDING
        print(f"+ random crop (padding = {padding})")
        steps.append(RandomCrop(input_size, padding=padding))

    if "random_resized_crop" in choices:
        scale = cfg.INPUT.RRCROP_SCALE
        print(f"+ random resized crop (size={input_size}, scale={scale})")
        steps.append(RandomResizedCrop(input_size, scale=scale, interpolation=interpolation))

    # The flip moves behind the tensor conversion and normalisation when only they follow it.
    flip_last = "random_flip" in choices and set(choices) <= FLIP_LAST_CHOICES
    if "random_flip" in choices:
        print("+ random flip")
        if not flip_last:
            steps.append(RandomHorizontalFlip())

    if "colorjitter" in choices:
        b, c, s, h = (
            cfg.INPUT.COLORJITTER_B,
            cfg.INPUT.COLORJITTER_C,
            cfg.INPUT.COLORJITTER_S,
            cfg.INPUT.COLORJITTER_H,
        )
        print(f"+ color jitter (brightness={b}, contrast={c}, saturation={s}, hue={h})")
        steps.append(ColorJitter(brightness=b, contrast=c, saturation=s, hue=h))

    if "randomgrayscale" in choices:
        print("+ random gray scale")
        steps.append(RandomGrayscale(p=cfg.INPUT.RGS_P))

    if "gaussian_blur" in choices:
        print(f"+ gaussian blur (kernel={cfg.INPUT.GB_K})")
        steps.append(RandomApply([GaussianBlur(cfg.INPUT.GB_K)], p=cfg.INPUT.GB_P))

    print("+ to torch tensor of range [0, 1]")
    steps.append(ImageToTensor())

    if "cutout" in choices:
        n_holes, length = cfg.INPUT.CUTOUT_N, cfg.INPUT.CUTOUT_LEN
        print(f"+ cutout (n_holes={n_holes}, length={length})")
        steps.append(Cutout(n_holes, length))

    if "normalize" in choices:
        print(f"+ normalization (mean={cfg.INPUT.PIXEL_MEAN}, std={cfg.INPUT.PIXEL_STD})")
        steps.append(normalize)

    if flip_last:
        steps.append(RandomHorizontalFlip())  # on the tensor: the same pixels as flipping the image

    if "gaussian_noise" in choices:
        print(f"+ gaussian noise (mean={cfg.INPUT.GN_MEAN}, std={cfg.INPUT.GN_STD})")
        steps.append(GaussianNoise(cfg.INPUT.GN_MEAN, cfg.INPUT.GN_STD))

    if "instance_norm" in choices:
        print("+ instance normalization")
        steps.append(InstanceNormalization())

    return Compose(steps)


def _build_transform_test(cfg, choices, target_size, normalize):
    print("Building transform_test")
    interpolation = INTERPOLATION_MODES[cfg.INPUT.INTERPOLATION]
    input_size = cfg.INPUT.SIZE

    mode = cfg.INPUT.RESIZE_MODE
    if mode == "squash":
        print(f"+ resize to {target_size} (squash)")
        steps = [Resize(input_size, interpolation=interpolation)]
    elif mode == "longest":
        print(f"+ resize the longer edge to {max(input_size)}")
        steps = [ResizeLongestEdge(max(input_size), interpolation=interpolation)]
        print(f"+ {target_size} center crop, padded with black")
        steps.append(CenterCrop(input_size))
    else:
        print(f"+ resize the smaller edge to {max(input_size)}")
        steps = [Resize(max(input_size), interpolation=interpolation)]
        print(f"+ {target_size} center crop")
        steps.append(CenterCrop(input_size))
    print("+ to torch tensor of range [0, 1]")
    steps.append(ImageToTensor())

    if "normalize" in choices:
        print(f"+ normalization (mean={cfg.INPUT.PIXEL_MEAN}, std={cfg.INPUT.PIXEL_STD})")
        steps.append(normalize)

    if "instance_norm" in choices:
        print("+ instance normalization")
        steps.append(InstanceNormalization())

    return Compose(steps)
