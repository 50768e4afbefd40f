"""Food-101, datasets.md §3.6."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import prepare_coop_splits, read_and_split_data


@DATASET_REGISTRY.register()
class Food101(DatasetBase):
    """101 dishes named by their folders; CoOp's 50/20/30 folder split (the official lists are not used)."""

    dataset_dir = "food-101"
    required_paths = ("images",)
    split_file = "split_zhou_Food101.json"
    template = "a photo of {}, a type of food."
    published_sizes = (50500, 20200, 30300)
    layout = """\
food-101/
  images/<class>/<id>.jpg …
  meta/, README.txt, license_agreement.txt (official files, not used)
  split_zhou_Food101.json
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg, self.dataset_dir, lambda: read_and_split_data(self.image_dir), self.split_path, self.image_dir
        )
        super().__init__(train_x=train, val=val, test=test)
