"""Stanford Cars (196 car models)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.readers import load_mat
from vlprompt.data.splits import CoopSplitDataset, build_datums, split_official_lists

TRAIN_ANNOS = "devkit/cars_train_annos.mat"
TEST_ANNOS = "cars_test_annos_withlabels.mat"
META = "devkit/cars_meta.mat"


def year_first(classname):
    """Move the trailing model year to the front: "AM General Hummer SUV 2000" -> "2000 AM General Hummer SUV"."""
    words = classname.split(" ")
    return " ".join([words[-1], *words[:-1]])


@DATASET_REGISTRY.register()
class StanfordCars(CoopSplitDataset):
    """196 car models ("<year> <make> <model> <body>"); split entries are relative to the dataset folder."""

    dataset_dir = "stanford_cars"
    required_paths = ("cars_train", "cars_test")
    split_file = "split_zhou_StanfordCars.json"
    split_sources = (TRAIN_ANNOS, META, TEST_ANNOS)
    template = "a photo of a {}."
    description_stem = "stanford_cars"
    published_sizes = (6509, 1635, 8041)
    layout = """\
stanford_cars/
  cars_train/00001.jpg …
  cars_test/00001.jpg …
  devkit/cars_train_annos.mat, cars_meta.mat, …   (only needed to build the split)
  cars_test_annos_withlabels.mat                  (only needed to build the split)
  split_zhou_StanfordCars.json
  split_fewshot/"""

    def build_split(self):
        """The devkit's train annotations split 80 % / 20 % into train / val; the test annotations are test."""
        return split_official_lists(
            lambda source: self.read_data(*source, META), ("cars_train", TRAIN_ANNOS), ("cars_test", TEST_ANNOS)
        )

    def read_data(self, image_folder, anno_file, meta_file):
        """Read an annotation .mat ("annotations": struct array with "fname" and 1-based "class").

        label = class - 1; class name = `cars_meta.mat` "class_names"[label] with the year moved first.
        """
        needed_for = f"build {self.split_file} from the devkit annotations"
        annotations = load_mat(os.path.join(self.dataset_dir, anno_file), needed_for)["annotations"][0]
        names = load_mat(os.path.join(self.dataset_dir, meta_file), needed_for)["class_names"][0]
        records = []
        for entry in annotations:
            label = int(entry["class"][0, 0]) - 1
            impath = os.path.join(self.dataset_dir, image_folder, str(entry["fname"][0]))
            records.append((impath, label, year_first(str(names[label][0]))))
        return build_datums(records, os.path.join(self.dataset_dir, anno_file))
