"""ImageNet-Sketch (test only), datasets.md §4.2."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.readers import read_class_folders, read_classnames


@DATASET_REGISTRY.register()
class ImageNetSketch(DatasetBase):
    """Sketches of the 1,000 ImageNet classes; train_x = test = every image (no val, no few-shot, no subsampling).

    Labels are the positions of the WNID folders in sorted order, hence ImageNet's labels.
    """

    dataset_dir = "imagenet-sketch"
    required_paths = ("images", "classnames.txt")
    template = "a photo of a {}."
    published_sizes = (None, None, 50889)
    layout = """\
imagenet-sketch/
  images/n01440764/ … (1,000 WNID folders)
  classnames.txt      (a copy of ImageNet's)"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")
        classnames_file = os.path.join(self.dataset_dir, "classnames.txt")
        data = read_class_folders(self.image_dir, read_classnames(classnames_file), classnames_file)
        super().__init__(train_x=data, test=data)
