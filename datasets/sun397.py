"""SUN397 scene categories (397 classes)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, split_official_lists

CLASS_FILE = "ClassName.txt"
PARTITION = ("Training_01.txt", "Testing_01.txt")


def scene_name(category):
    """Class name of a category folder: drop the initial letter, reverse the rest.

    "a/abbey" -> "abbey"; "a/apartment_building/outdoor" -> "outdoor apartment_building".
    """
    return " ".join(category.split("/")[1:][::-1])


@DATASET_REGISTRY.register()
class SUN397(CoopSplitDataset):
    """397 scene categories; the split is built from partition 1 when the JSON is missing."""

    dataset_dir = "sun397"
    image_folder = "SUN397"
    required_paths = ("SUN397",)
    split_file = "split_zhou_SUN397.json"
    split_sources = (CLASS_FILE, *PARTITION)
    template = "a photo of a {}."
    description_stem = "sun397"
    published_sizes = (15880, 3970, 19850)
    layout = """\
sun397/
  SUN397/a/abbey/sun_<id>.jpg …
  ClassName.txt, Training_01.txt, Testing_01.txt   (from Partitions.zip; only needed to build the split)
  split_zhou_SUN397.json
  split_fewshot/"""

    def build_split(self):
        """Label = line of the category in ClassName.txt ("/a/abbey" lines).

        Training_01 is split 80 % / 20 % into train / val; Testing_01 is test.
        """
        with open(os.path.join(self.dataset_dir, CLASS_FILE)) as f:
            categories = [line.strip()[1:] for line in f]
        cname2lab = {category: label for label, category in enumerate(categories)}
        return split_official_lists(lambda list_file: self.read_data(cname2lab, list_file), *PARTITION)

    def read_data(self, cname2lab, list_file):
        """Read a partition list: image paths with a leading "/"; the category is the path's folder."""

        def parse_line(line):
            relative = line.strip()[1:]
            if not relative:
                return None
            category = os.path.dirname(relative)
            return category, os.path.join(self.image_dir, relative), scene_name(category)

        return self.read_list_file(list_file, parse_line, cname2lab, "category", CLASS_FILE, "/LETTER/CATEGORY/IMAGE.jpg")
