"""Describable Textures Dataset (datasets.md §3.9)."""
import os

from vlprompt.data import splits
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import prepare_coop_splits


@DATASET_REGISTRY.register()
class DescribableTextures(DatasetBase):
    """47 texture classes named by their folders; CoOp's 50/20/30 folder split.

    `read_and_split_data` stays reachable here because CoOp-family dataset files
    call `DescribableTextures.read_and_split_data(...)`.
    """

    dataset_dir = "dtd"
    required_paths = ("images",)
    split_file = "split_zhou_DescribableTextures.json"
    template = "{} texture."
    published_sizes = (2820, 1128, 1692)
    layout = """\
dtd/
  images/<category>/<category>_NNNN.jpg …
  imdb/, labels/ (official splits, not used)
  split_zhou_DescribableTextures.json
  split_fewshot/"""

    read_and_split_data = staticmethod(splits.read_and_split_data)

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg,
            self.dataset_dir,
            lambda: self.read_and_split_data(self.image_dir),
            self.split_path,
            self.image_dir,
        )
        super().__init__(train_x=train, val=val, test=test)
