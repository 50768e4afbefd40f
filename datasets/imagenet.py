"""ImageNet (ILSVRC-2012, 1000 classes)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.readers import class_folders, read_class_folders, read_classnames
from vlprompt.data.splits import load_datum_cache, prepare_coop_splits, write_datum_json

PREPROCESSED = "preprocessed"


@DATASET_REGISTRY.register()
class ImageNet(DatasetBase):
    """1,000 classes; the official train set, and the official val set as val and test.

    Labels are the positions of the WordNet-id folders of images/train/ in sorted
    order, class names come from classnames.txt. The folder listing is cached in
    the dataset folder: Dassl's `preprocessed.pkl` is read if present (restricted
    unpickler, moved paths rewritten), else our `preprocessed.json`, else the
    folders are listed and the listing is written to `preprocessed.json`. The cache
    fixes the image order, hence which images few-shot sampling picks.
    """

    dataset_dir = "imagenet"
    required_paths = ("images/train", "images/val", "classnames.txt")
    template = "a photo of a {}."
    description_stem = "imagenet"
    published_sizes = (1281167, None, 50000)
    layout = """\
imagenet/
  images/
    train/   n01440764/ … (1,000 class folders named by WordNet id)
    val/     n01440764/ … (the 50,000 official val images, sorted into the same 1,000 folders)
  classnames.txt          (lines "WNID CLASS NAME")
  preprocessed.pkl / preprocessed.json   (folder listing, written on first use)
  split_fewshot/"""

    read_classnames = staticmethod(read_classnames)

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")
        self.preprocessed = os.path.join(self.dataset_dir, PREPROCESSED)

        train, _, test = prepare_coop_splits(cfg, self.dataset_dir, self._read_listing)
        super().__init__(train_x=train, val=test, test=test)

    def _read_listing(self):
        """(train, None, test): from the listing cache, or listed and cached."""
        cached = load_datum_cache(self.preprocessed, self.dataset_dir)
        if cached is not None:
            path, data = cached
            if not {"train", "test"} <= set(data):
                raise self.layout_error(
                    f'{path} has no "train" and "test" lists; delete it to list the folders again'
                )
            return data["train"], None, data["test"]

        classnames_file = os.path.join(self.dataset_dir, "classnames.txt")
        classnames = self.read_classnames(classnames_file)
        folders = class_folders(os.path.join(self.image_dir, "train"))
        val_folders = class_folders(os.path.join(self.image_dir, "val"))
        if val_folders != folders:
            missing = sorted(set(folders) - set(val_folders))[:5]
            extra = sorted(set(val_folders) - set(folders))[:5]
            raise self.layout_error(
                f"{self.image_dir}/val/ must hold the same class folders as {self.image_dir}/train/ (the "
                f"official val archive is flat: sort its images into WNID folders first); val lacks "
                f"{missing or 'none'}, has extra {extra or 'none'}",
            )
        train = read_class_folders(os.path.join(self.image_dir, "train"), classnames, classnames_file, folders)
        test = read_class_folders(os.path.join(self.image_dir, "val"), classnames, classnames_file, folders)
        try:
            write_datum_json({"train": train, "test": test}, self.preprocessed + ".json", compact=True)
        except OSError as error:
            print(f"Could not write {self.preprocessed}.json ({error}); the folders are listed again next time")
        return train, None, test
