"""EuroSAT (RGB, 10 land-cover classes)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, read_and_split_data

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
class EuroSAT(CoopSplitDataset):
    """10 land-use classes (Sentinel-2 RGB); CoOp's 50/20/30 folder split."""

    dataset_dir = "eurosat"
    image_folder = "2750"
    required_paths = ("2750",)
    split_file = "split_zhou_EuroSAT.json"
    template = "a centered satellite photo of {}."
    description_stem = "eurosat"
    published_sizes = (13500, 5400, 8100)
    layout = """\
eurosat/
  2750/AnnualCrop/AnnualCrop_1.jpg …
  split_zhou_EuroSAT.json
  split_fewshot/"""

    def build_split(self):
        """CoOp's folder split (50 % / 20 % / 30 % per class)."""
        return read_and_split_data(self.image_dir, new_cnames=NEW_CNAMES)
