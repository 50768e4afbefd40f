"""Oxford-IIIT Pets (37 cat and dog breeds)."""
import os

from vlprompt.data import splits
from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, build_datums, split_official_lists


@DATASET_REGISTRY.register()
class OxfordPets(CoopSplitDataset):
    """37 breeds; labels and class names from the official annotation files.

    The CoOp split helpers stay reachable as static methods here because
    CoOp-family dataset files call `OxfordPets.read_split(...)` and friends.
    """

    dataset_dir = "oxford_pets"
    image_folder = "images"
    required_paths = ("images",)
    split_file = "split_zhou_OxfordPets.json"
    split_sources = ("annotations/trainval.txt", "annotations/test.txt")
    template = "a photo of a {}, a type of pet."
    description_stem = "oxford_pets"
    published_sizes = (2944, 736, 3669)
    layout = """\
oxford_pets/
  images/Abyssinian_1.jpg …
  annotations/trainval.txt, test.txt   (only needed to build the split)
  split_zhou_OxfordPets.json
  split_fewshot/"""

    read_split = staticmethod(splits.read_split)
    save_split = staticmethod(splits.save_split)
    split_trainval = staticmethod(splits.split_trainval)
    subsample_classes = staticmethod(splits.subsample_classes)

    @property
    def anno_dir(self):
        """The folder of the annotation lists (Dassl's attribute)."""
        return os.path.join(self.dataset_dir, "annotations")

    def build_split(self):
        """annotations/trainval.txt split 80 % / 20 % into train / val; annotations/test.txt is test."""
        return split_official_lists(self.read_data, "trainval.txt", "test.txt")

    def read_data(self, split_file):
        """Read an annotation list: lines "IMAGE CLASS-ID SPECIES BREED-ID".

        label = CLASS-ID - 1; class name = IMAGE without its final "_<number>", lower-cased.
        """
        filepath = os.path.join(self.anno_dir, split_file)
        records = []
        with open(filepath) as f:
            for line in f:
                fields = line.split()
                if not fields:
                    continue
                imname, class_id = fields[0], fields[1]
                breed = "_".join(imname.split("_")[:-1]).lower()
                records.append((os.path.join(self.image_dir, imname + ".jpg"), int(class_id) - 1, breed))
        return build_datums(records, filepath)
