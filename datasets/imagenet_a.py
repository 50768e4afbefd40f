"""ImageNet-A, natural adversarial examples of 200 ImageNet classes (test only)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.readers import ClassFolderTestSet


@DATASET_REGISTRY.register()
class ImageNetA(ClassFolderTestSet):
    """A 200-way problem: the classes are the WNID folders present (sorted), named from ImageNet's classnames.txt.

    train_x = test = every image; no val, no few-shot, no subsampling. The folder is
    `imagenet-adversarial/` (CoOp) or `imagenet-a/` (the RAda fork), tried in that order.
    """

    dataset_dir = "imagenet-adversarial"
    image_folder = "imagenet-a"
    dataset_dir_aliases = ("imagenet-a",)
    required_paths = ("imagenet-a", "classnames.txt")
    template = "a photo of a {}."
    description_stem = "imagenet_a"
    published_sizes = (None, None, 7500)
    layout = """\
imagenet-adversarial/   (or imagenet-a/)
  imagenet-a/n01498041/ … (200 WNID folders; README.txt is skipped)
  classnames.txt          (ImageNet's full 1,000-line file)"""
