"""SUN397 scene categories, datasets.md §3.8."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import build_datums, prepare_coop_splits, split_trainval

CLASS_FILE = "ClassName.txt"
PARTITION = ("Training_01.txt", "Testing_01.txt")


def scene_name(category):
    """Class name of a category folder: drop the initial letter, reverse the rest.

    "a/abbey" -> "abbey"; "a/apartment_building/outdoor" -> "outdoor apartment_building".
    """
    return " ".join(category.split("/")[1:][::-1])


@DATASET_REGISTRY.register()
class SUN397(DatasetBase):
    """397 scene categories; the split is built from partition 1 when the JSON is missing."""

    dataset_dir = "sun397"
    required_paths = ("SUN397",)
    split_file = "split_zhou_SUN397.json"
    split_sources = (CLASS_FILE, *PARTITION)
    template = "a photo of a {}."
    published_sizes = (15880, 3970, 19850)
    layout = """\
sun397/
  SUN397/a/abbey/sun_<id>.jpg …
  ClassName.txt, Training_01.txt, Testing_01.txt   (from Partitions.zip; only needed to build the split)
  split_zhou_SUN397.json
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "SUN397")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg, self.dataset_dir, self._build_split, self.split_path, self.image_dir
        )
        super().__init__(train_x=train, val=val, test=test)

    def _build_split(self):
        """Label = line of the category in ClassName.txt ("/a/abbey" lines).

        Training_01 is split 80 % / 20 % into train / val; Testing_01 is test.
        """
        with open(os.path.join(self.dataset_dir, CLASS_FILE)) as f:
            categories = [line.strip()[1:] for line in f]
        cname2lab = {category: label for label, category in enumerate(categories)}
        trainval = self.read_data(cname2lab, PARTITION[0])
        test = self.read_data(cname2lab, PARTITION[1])
        train, val = split_trainval(trainval)
        return train, val, test

    def read_data(self, cname2lab, list_file):
        """Read a partition list: image paths with a leading "/"; the category is the path's folder."""
        filepath = os.path.join(self.dataset_dir, list_file)
        records = []
        with open(filepath) as f:
            for number, line in enumerate(f, start=1):
                relative = line.strip()[1:]
                if not relative:
                    continue
                category = os.path.dirname(relative)
                if category not in cname2lab:
                    raise self.layout_error(
                        f'{filepath}, line {number}: the category "{category}" is not a line of '
                        f"{os.path.join(self.dataset_dir, CLASS_FILE)}"
                    )
                records.append((os.path.join(self.image_dir, relative), cname2lab[category], scene_name(category)))
        return build_datums(records, filepath)
