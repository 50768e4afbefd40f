"""ImageNet-Sketch, sketches of the 1000 ImageNet classes (test only)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.readers import ClassFolderTestSet


@DATASET_REGISTRY.register()
class ImageNetSketch(ClassFolderTestSet):
    """Sketches of the 1,000 ImageNet classes; train_x = test = every image (no val, no few-shot, no subsampling).

    Labels are the positions of the WNID folders in sorted order, hence ImageNet's labels.
    """

    dataset_dir = "imagenet-sketch"
    image_folder = "images"
    required_paths = ("images", "classnames.txt")
    template = "a photo of a {}."
    description_stem = "imagenet_sketch"
    published_sizes = (None, None, 50889)
    layout = """\
imagenet-sketch/
  images/n01440764/ … (1,000 WNID folders)
  classnames.txt      (a copy of ImageNet's)"""
