"""FGVC-Aircraft 2013b at the variant level, datasets.md §3.7."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import build_datums, prepare_coop_splits

SPLIT_LISTS = {name: f"images_variant_{name}.txt" for name in ("train", "val", "test")}


@DATASET_REGISTRY.register()
class FGVCAircraft(DatasetBase):
    """100 aircraft variants; the official variant train / val / test lists are read at every run (no JSON)."""

    dataset_dir = "fgvc_aircraft"
    required_paths = ("images", "variants.txt", *SPLIT_LISTS.values())
    template = "a photo of a {}, a type of aircraft."
    published_sizes = (3334, 3333, 3333)
    layout = """\
fgvc_aircraft/            (the data/ folder of fgvc-aircraft-2013b, renamed)
  images/<7-digit id>.jpg …
  variants.txt
  images_variant_train.txt, images_variant_val.txt, images_variant_test.txt
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "images")

        train, val, test = prepare_coop_splits(cfg, self.dataset_dir, self._read_official_split)
        super().__init__(train_x=train, val=val, test=test)

    def _read_official_split(self):
        with open(os.path.join(self.dataset_dir, "variants.txt")) as f:
            classnames = [line.strip() for line in f]
        cname2lab = {name: label for label, name in enumerate(classnames)}
        return tuple(self.read_data(cname2lab, SPLIT_LISTS[name]) for name in ("train", "val", "test"))

    def read_data(self, cname2lab, list_file):
        """Read lines "IMAGEID VARIANT NAME".

        Image images/IMAGEID.jpg; label = the line of VARIANT NAME in variants.txt.
        """
        filepath = os.path.join(self.dataset_dir, list_file)
        records = []
        with open(filepath) as f:
            for number, line in enumerate(f, start=1):
                image_id, _, classname = line.strip().partition(" ")
                if not image_id:
                    continue
                if classname not in cname2lab:
                    raise self.layout_error(
                        f'{filepath}, line {number}: the variant "{classname}" is not a line of '
                        f"{os.path.join(self.dataset_dir, 'variants.txt')}"
                    )
                records.append((os.path.join(self.image_dir, image_id + ".jpg"), cname2lab[classname], classname))
        return build_datums(records, filepath)
