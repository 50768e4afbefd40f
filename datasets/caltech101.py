"""Caltech-101, datasets.md §3.2."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import prepare_coop_splits, read_and_split_data

IGNORED = ("BACKGROUND_Google", "Faces_easy")
# Folder name -> class name, for the folders whose name is not the class name (applied when a split is built).
NEW_CNAMES = {"airplanes": "airplane", "Faces": "face", "Leopards": "leopard", "Motorbikes": "motorbike"}


@DATASET_REGISTRY.register()
class Caltech101(DatasetBase):
    """100 object categories (the background clutter and the duplicate face folder are left out)."""

    dataset_dir = "caltech-101"
    required_paths = ("101_ObjectCategories",)
    split_file = "split_zhou_Caltech101.json"
    template = "a photo of a {}."
    published_sizes = (4128, 1649, 2465)
    layout = """\
caltech-101/
  101_ObjectCategories/<category>/image_0001.jpg …
  split_zhou_Caltech101.json
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "101_ObjectCategories")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg,
            self.dataset_dir,
            lambda: read_and_split_data(self.image_dir, ignored=IGNORED, new_cnames=NEW_CNAMES),
            self.split_path,
            self.image_dir,
        )
        super().__init__(train_x=train, val=val, test=test)
