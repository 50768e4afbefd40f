"""Caltech-101 (CoOp's split, the BACKGROUND_Google and Faces_easy folders left out)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, read_and_split_data

IGNORED = ("BACKGROUND_Google", "Faces_easy")
# Folder name -> class name, for the folders whose name is not the class name (applied when a split is built).
NEW_CNAMES = {"airplanes": "airplane", "Faces": "face", "Leopards": "leopard", "Motorbikes": "motorbike"}


@DATASET_REGISTRY.register()
class Caltech101(CoopSplitDataset):
    """100 object categories (the background clutter and the duplicate face folder are left out)."""

    dataset_dir = "caltech-101"
    image_folder = "101_ObjectCategories"
    required_paths = ("101_ObjectCategories",)
    split_file = "split_zhou_Caltech101.json"
    template = "a photo of a {}."
    description_stem = "caltech"
    published_sizes = (4128, 1649, 2465)
    layout = """\
caltech-101/
  101_ObjectCategories/<category>/image_0001.jpg …
  split_zhou_Caltech101.json
  split_fewshot/"""

    def build_split(self):
        """CoOp's folder split (50 % / 20 % / 30 % per class)."""
        return read_and_split_data(self.image_dir, ignored=IGNORED, new_cnames=NEW_CNAMES)
