"""ImageNet-R, renditions of 200 ImageNet classes (test only), datasets.md §4.4."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.readers import read_class_folders, read_classnames


@DATASET_REGISTRY.register()
class ImageNetR(DatasetBase):
    """A 200-way problem: the classes are the WNID folders present (sorted), named from ImageNet's classnames.txt.

    train_x = test = every image; no val, no few-shot, no subsampling. The folder is
    `imagenet-rendition/` (CoOp) or `imagenet-r/` (the RAda fork), tried in that order.
    """

    dataset_dir = "imagenet-rendition"
    dataset_dir_aliases = ("imagenet-r",)
    required_paths = ("imagenet-r", "classnames.txt")
    template = "a photo of a {}."
    published_sizes = (None, None, 30000)
    layout = """\
imagenet-rendition/   (or imagenet-r/)
  imagenet-r/n01443537/ … (200 WNID folders; README.txt is skipped)
  classnames.txt          (ImageNet's full 1,000-line file)"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "imagenet-r")
        classnames_file = os.path.join(self.dataset_dir, "classnames.txt")
        data = read_class_folders(self.image_dir, read_classnames(classnames_file), classnames_file)
        super().__init__(train_x=data, test=data)
