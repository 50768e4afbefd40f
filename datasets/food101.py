"""Food-101 (101 dish classes)."""
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, read_and_split_data


@DATASET_REGISTRY.register()
class Food101(CoopSplitDataset):
    """101 dishes named by their folders; CoOp's 50/20/30 folder split (the official lists are not used)."""

    dataset_dir = "food-101"
    image_folder = "images"
    required_paths = ("images",)
    split_file = "split_zhou_Food101.json"
    template = "a photo of {}, a type of food."
    description_stem = "food101"
    published_sizes = (50500, 20200, 30300)
    layout = """\
food-101/
  images/<class>/<id>.jpg …
  meta/, README.txt, license_agreement.txt (official files, not used)
  split_zhou_Food101.json
  split_fewshot/"""

    def build_split(self):
        """CoOp's folder split (50 % / 20 % / 30 % per class)."""
        return read_and_split_data(self.image_dir)
