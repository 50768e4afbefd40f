"""ImageNet-R, renditions of 200 ImageNet classes (test only)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.readers import ClassFolderTestSet


@DATASET_REGISTRY.register()
class ImageNetR(ClassFolderTestSet):
    """A 200-way problem: the classes are the WNID folders present (sorted), named from ImageNet's classnames.txt.

    train_x = test = every image; no val, no few-shot, no subsampling. The folder is
    `imagenet-rendition/` (CoOp) or `imagenet-r/` (the RAda fork), tried in that order.
    """

    dataset_dir = "imagenet-rendition"
    image_folder = "imagenet-r"
    dataset_dir_aliases = ("imagenet-r",)
    required_paths = ("imagenet-r", "classnames.txt")
    template = "a photo of a {}."
    description_stem = "imagenet_r"
    published_sizes = (None, None, 30000)
    layout = """\
imagenet-rendition/   (or imagenet-r/)
  imagenet-r/n01443537/ … (200 WNID folders; README.txt is skipped)
  classnames.txt          (ImageNet's full 1,000-line file)"""
