"""Describable Textures Dataset (DTD, 47 texture classes)."""
from vlprompt.data import splits
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset


@DATASET_REGISTRY.register()
class DescribableTextures(CoopSplitDataset):
    """47 texture classes named by their folders; CoOp's 50/20/30 folder split.

    `read_and_split_data` stays reachable here because CoOp-family dataset files
    call `DescribableTextures.read_and_split_data(...)`.
    """

    dataset_dir = "dtd"
    image_folder = "images"
    required_paths = ("images",)
    split_file = "split_zhou_DescribableTextures.json"
    template = "{} texture."
    description_stem = "dtd"
    published_sizes = (2820, 1128, 1692)
    layout = """\
dtd/
  images/<category>/<category>_NNNN.jpg …
  imdb/, labels/ (official splits, not used)
  split_zhou_DescribableTextures.json
  split_fewshot/"""

    read_and_split_data = staticmethod(splits.read_and_split_data)

    def build_split(self):
        """CoOp's folder split (50 % / 20 % / 30 % per class)."""
        return self.read_and_split_data(self.image_dir)
