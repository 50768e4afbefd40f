"""ImageNet-A, natural adversarial examples of 200 ImageNet classes (test only), datasets.md §4.3."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.readers import read_class_folders, read_classnames


@DATASET_REGISTRY.register()
class ImageNetA(DatasetBase):
    """A 200-way problem: the classes are the WNID folders present (sorted), named from ImageNet's classnames.txt.

    train_x = test = every image; no val, no few-shot, no subsampling. The folder is
    `imagenet-adversarial/` (CoOp) or `imagenet-a/` (the RAda fork), tried in that order.
    """

    dataset_dir = "imagenet-adversarial"
    dataset_dir_aliases = ("imagenet-a",)
    required_paths = ("imagenet-a", "classnames.txt")
    template = "a photo of a {}."
    published_sizes = (None, None, 7500)
    layout = """\
imagenet-adversarial/   (or imagenet-a/)
  imagenet-a/n01498041/ … (200 WNID folders; README.txt is skipped)
  classnames.txt          (ImageNet's full 1,000-line file)"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "imagenet-a")
        classnames_file = os.path.join(self.dataset_dir, "classnames.txt")
        data = read_class_folders(self.image_dir, read_classnames(classnames_file), classnames_file)
        super().__init__(train_x=data, test=data)
