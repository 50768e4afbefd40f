"""Oxford-IIIT Pets (datasets.md §3.3)."""
import os

from vlprompt.data import splits
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import build_datums, prepare_coop_splits


@DATASET_REGISTRY.register()
class OxfordPets(DatasetBase):
    """37 breeds; labels and class names from the official annotation files.

    The CoOp split helpers stay reachable as static methods here because
    CoOp-family dataset files call `OxfordPets.read_split(...)` and friends.
    """

    dataset_dir = "oxford_pets"
    required_paths = ("images",)
    split_file = "split_zhou_OxfordPets.json"
    split_sources = ("annotations/trainval.txt", "annotations/test.txt")
    template = "a photo of a {}, a type of pet."
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

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")
        self.anno_dir = os.path.join(self.dataset_dir, "annotations")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg, self.dataset_dir, self._build_split, self.split_path, self.image_dir
        )
        super().__init__(train_x=train, val=val, test=test)

    def _build_split(self):
        trainval = self.read_data("trainval.txt")
        test = self.read_data("test.txt")
        train, val = self.split_trainval(trainval)
        return train, val, test

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
