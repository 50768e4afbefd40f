"""Oxford 102 Flowers (Flowers102)."""
import os
import random

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.readers import load_mat
from vlprompt.data.splits import CoopSplitDataset, build_datums
from vlprompt.utils import read_json

LABEL_FILE = "imagelabels.mat"
NAME_FILE = "cat_to_name.json"


@DATASET_REGISTRY.register()
class OxfordFlowers(CoopSplitDataset):
    """102 flower species; labels from imagelabels.mat, names from cat_to_name.json."""

    dataset_dir = "oxford_flowers"
    image_folder = "jpg"
    required_paths = ("jpg",)
    split_file = "split_zhou_OxfordFlowers.json"
    split_sources = (LABEL_FILE, NAME_FILE)
    template = "a photo of a {}, a type of flower."
    description_stem = "oxford_flowers"
    published_sizes = (4093, 1633, 2463)
    layout = """\
oxford_flowers/
  jpg/image_00001.jpg …
  imagelabels.mat       (only needed to build the split)
  cat_to_name.json      (only needed to build the split)
  split_zhou_OxfordFlowers.json
  split_fewshot/"""

    def build_split(self):
        """Per label (in order of first appearance): shuffle its images, then 50 % / 20 % / 30 %.

        imagelabels.mat "labels"[i] is the 1-based label of image_{i+1:05d}.jpg;
        the class name is cat_to_name.json[str(label)].
        """
        label_file = os.path.join(self.dataset_dir, LABEL_FILE)
        labels = load_mat(label_file, f"build {self.split_file} from {LABEL_FILE}")["labels"][0]
        name_file = os.path.join(self.dataset_dir, NAME_FILE)
        lab2cname = read_json(name_file)
        impaths_by_label = {}
        for index, label in enumerate(labels):
            impath = os.path.join(self.image_dir, f"image_{index + 1:05d}.jpg")
            impaths_by_label.setdefault(int(label), []).append(impath)

        print("Splitting data into 50% train, 20% val, and 30% test")
        records = {"train": [], "val": [], "test": []}
        for label, impaths in impaths_by_label.items():
            random.shuffle(impaths)
            n_train = round(len(impaths) * 0.5)
            n_val = round(len(impaths) * 0.2)
            if n_train <= 0 or n_val <= 0 or len(impaths) - n_train - n_val <= 0:
                raise ValueError(
                    f"Cannot split label {label} of {label_file}: {len(impaths)} image(s) cannot give "
                    "each of train / val / test at least one."
                )
            if str(label) not in lab2cname:
                raise self.layout_error(f'{name_file} has no name for label "{label}" of {label_file}')
            classname = lab2cname[str(label)]
            parts = {"train": impaths[:n_train], "val": impaths[n_train : n_train + n_val],
                     "test": impaths[n_train + n_val :]}
            for name, paths in parts.items():
                records[name].extend((path, label - 1, classname) for path in paths)
        return tuple(build_datums(records[name], label_file) for name in ("train", "val", "test"))
