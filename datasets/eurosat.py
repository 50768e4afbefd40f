"""EuroSAT (datasets.md §3.10)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import prepare_coop_splits, read_and_split_data

# Folder name -> class name used in prompts (applied when a split is built).
NEW_CNAMES = {
    "AnnualCrop": "Annual Crop Land",
    "Forest": "Forest",
    "HerbaceousVegetation": "Herbaceous Vegetation Land",
    "Highway": "Highway or Road",
    "Industrial": "Industrial Buildings",
    "Pasture": "Pasture Land",
    "PermanentCrop": "Permanent Crop Land",
    "Residential": "Residential Buildings",
    "River": "River",
    "SeaLake": "Sea or Lake",
}


@DATASET_REGISTRY.register()
class EuroSAT(DatasetBase):
    """10 land-use classes (Sentinel-2 RGB); CoOp's 50/20/30 folder split."""

    dataset_dir = "eurosat"
    required_paths = ("2750",)
    split_file = "split_zhou_EuroSAT.json"
    template = "a centered satellite photo of {}."
    published_sizes = (13500, 5400, 8100)
    layout = """\
eurosat/
  2750/AnnualCrop/AnnualCrop_1.jpg …
  split_zhou_EuroSAT.json
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "2750")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg,
            self.dataset_dir,
            lambda: read_and_split_data(self.image_dir, new_cnames=NEW_CNAMES),
            self.split_path,
            self.image_dir,
        )
        super().__init__(train_x=train, val=val, test=test)
