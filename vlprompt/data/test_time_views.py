"""Augmented views of one test image for test-time training (TPT / PromptAlign protocol).

For every test image the loader returns a stack of V views [V, 3, H, W]: view 0 is the
ordinary test view (resize, centre crop, normalise), views 1..V-1 follow INPUT.TRANSFORMS
as the training transform reads them, among VIEW_TRANSFORMS: a random resized crop (or, without
"random_resized_crop", a resize to INPUT.SIZE), a horizontal flip with "random_flip",
normalisation with "normalize"; optionally AugMix (TPT applies AugMix to the fine-grained
datasets and plain crops to the ImageNet variants). Other transforms are rejected
(ConfigError naming INPUT.TRANSFORMS). The random numbers of an image come from
a generator seeded by (SEED, the image path relative to DATASET.ROOT), never from the global
stream, so an image gets the same views whatever the order of the test set, the batch size
or the number of loader workers.
"""
import functools
import hashlib
import os.path as osp

import torch
from PIL import Image, ImageOps

from vlprompt.config import ConfigError
from vlprompt.utils import read_image

from .data_manager import DatasetWrapper

__all__ = ["EpisodeViews", "VIEW_TRANSFORMS", "ViewAugmenter", "check_view_transforms", "image_seed"]

# The INPUT.TRANSFORMS entries the augmented views implement (TPT's views: crop and flip).
VIEW_TRANSFORMS = ("random_resized_crop", "random_flip", "normalize")


def check_view_transforms(transforms):
    """Raise ConfigError unless every entry of INPUT.TRANSFORMS is in VIEW_TRANSFORMS."""
    unsupported = [name for name in transforms if name not in VIEW_TRANSFORMS]
    if unsupported:
        raise ConfigError(
            f"INPUT.TRANSFORMS {list(transforms)}: the test-time views support only {list(VIEW_TRANSFORMS)} "
            f"(AugMix is the test-time method's AUGMIX key), not {unsupported}."
        )


def image_seed(seed, impath, root):
    """64-bit seed of one image from the run's SEED and its path relative to ``root``."""
    relative = osp.relpath(impath, root) if root else impath
    digest = hashlib.sha256(f"{seed}:{relative.replace(osp.sep, '/')}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % 2**63


def _level():
    """AugMix's strength at severity 1: U(0.1, 1), on a scale where 10 is the full range."""
    return 0.1 + 0.9 * torch.rand(()).item()


def _signed(value):
    return value if torch.rand(()).item() < 0.5 else -value


def _affine(image, coefficients):
    return image.transform(image.size, Image.AFFINE, coefficients, resample=Image.BILINEAR)


def _autocontrast(image):
    return ImageOps.autocontrast(image)


def _equalize(image):
    return ImageOps.equalize(image)


def _posterize(image):
    return ImageOps.posterize(image, 4 - int(_level() * 4 / 10))


def _rotate(image):
    return image.rotate(_signed(int(_level() * 30 / 10)), resample=Image.BILINEAR)


def _solarize(image):
    return ImageOps.solarize(image, 256 - int(_level() * 256 / 10))


def _shear_x(image):
    return _affine(image, (1, _signed(_level() * 0.3 / 10), 0, 0, 1, 0))


def _shear_y(image):
    return _affine(image, (1, 0, 0, _signed(_level() * 0.3 / 10), 1, 0))


def _translate_x(image):
    return _affine(image, (1, 0, _signed(int(_level() * image.size[0] / 3 / 10)), 0, 1, 0))


def _translate_y(image):
    return _affine(image, (1, 0, 0, 0, 1, _signed(int(_level() * image.size[1] / 3 / 10))))


AUGMIX_OPERATIONS = (
    _autocontrast, _equalize, _posterize, _rotate, _solarize, _shear_x, _shear_y, _translate_x, _translate_y,
)


class ViewAugmenter:
    """Builds the V views of one PIL image (see the module docstring).

    Args:
        cfg: reads INPUT.SIZE, INTERPOLATION, RRCROP_SCALE, PIXEL_MEAN/STD, TRANSFORMS
            (entries among VIEW_TRANSFORMS, else ConfigError); empty preprocessing keys are the backbone's.
        num_views: V (64 in TPT and RAda).
        augmix: mix three chains of 1-3 AugMix operations into each augmented view.
        interpolation: resampling of the random crops (default INPUT.INTERPOLATION; TPT's
            crops use torchvision's default, "bilinear", its test view INPUT.INTERPOLATION).
    """

    def __init__(self, cfg, num_views, augmix=False, interpolation=None):
        import torchvision.transforms as T

        from vlprompt.clip.preprocess import resolved_input

        from .transforms import INTERPOLATION_MODES, build_transform

        cfg = resolved_input(cfg)  # empty preprocessing keys: the backbone's
        transforms = cfg.INPUT.TRANSFORMS
        check_view_transforms(transforms)
        self.num_views = num_views
        self.augmix = augmix
        self.test_view = build_transform(cfg, is_train=False)
        interpolation = INTERPOLATION_MODES[interpolation or cfg.INPUT.INTERPOLATION]
        if "random_resized_crop" in transforms:
            geometry = [T.RandomResizedCrop(cfg.INPUT.SIZE, scale=cfg.INPUT.RRCROP_SCALE, interpolation=interpolation)]
        else:
            geometry = [T.Resize(cfg.INPUT.SIZE, interpolation=interpolation)]
        if "random_flip" in transforms:
            geometry.append(T.RandomHorizontalFlip())
        self.crop = T.Compose(geometry)
        steps = [T.ToTensor()]
        if "normalize" in transforms:
            steps.append(T.Normalize(mean=cfg.INPUT.PIXEL_MEAN, std=cfg.INPUT.PIXEL_STD))
        self.to_tensor = T.Compose(steps)

    def __call__(self, image, seed):
        """Views [V, 3, H, W]: the test view, then V - 1 views drawn from ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            views = [self.test_view(image)] + [self._augmented(image) for _ in range(self.num_views - 1)]
        return torch.stack(views)

    def _augmented(self, image):
        cropped = self.crop(image)
        view = self.to_tensor(cropped)
        if not self.augmix:
            return view
        weights = torch.distributions.Dirichlet(torch.ones(3)).sample()
        keep = torch.distributions.Beta(1.0, 1.0).sample()
        mixed = torch.zeros_like(view)
        for weight in weights:
            chain = cropped
            for _ in range(int(torch.randint(1, 4, ()).item())):
                chain = AUGMIX_OPERATIONS[int(torch.randint(len(AUGMIX_OPERATIONS), ()).item())](chain)
            mixed += weight * self.to_tensor(chain)
        return keep * view + (1 - keep) * mixed


class EpisodeViews(DatasetWrapper):
    """Evaluation dataset whose items hold "img" = the views [V, 3, H, W] of one image.

    Built by ``build_data_loader(..., dataset_wrapper=EpisodeViews.factory(augmenter))``.
    """

    def __init__(self, cfg, data_source, transform=None, is_train=False, augmenter=None):
        super().__init__(cfg, data_source, transform=None, is_train=False)
        self.augmenter = augmenter
        self.seed, self.root = cfg.SEED, cfg.DATASET.ROOT

    @classmethod
    def factory(cls, augmenter):
        """A wrapper class for ``build_data_loader`` bound to ``augmenter``."""
        return functools.partial(cls, augmenter=augmenter)

    def __getitem__(self, idx):
        item = self.data_source[idx]
        views = self.augmenter(read_image(item.impath), image_seed(self.seed, item.impath, self.root))
        return {"img": views, "label": item.label, "domain": item.domain, "impath": item.impath, "index": idx}
