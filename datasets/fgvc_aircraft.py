"""FGVC-Aircraft 2013b at the variant level (100 classes)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset

SPLIT_LISTS = {name: f"images_variant_{name}.txt" for name in ("train", "val", "test")}


@DATASET_REGISTRY.register()
class FGVCAircraft(CoopSplitDataset):
    """100 aircraft variants; the official variant train / val / test lists are read at every run (no JSON)."""

    dataset_dir = "fgvc_aircraft"
    image_folder = "images"
    required_paths = ("images", "variants.txt", *SPLIT_LISTS.values())
    template = "a photo of a {}, a type of aircraft."
    description_stem = "fgvc"
    published_sizes = (3334, 3333, 3333)
    layout = """\
fgvc_aircraft/            (the data/ folder of fgvc-aircraft-2013b, renamed)
  images/<7-digit id>.jpg …
  variants.txt
  images_variant_train.txt, images_variant_val.txt, images_variant_test.txt
  split_fewshot/"""

    def build_split(self):
        """The official variant train / val / test lists; label = line of the variant in variants.txt."""
        with open(os.path.join(self.dataset_dir, "variants.txt")) as f:
            classnames = [line.strip() for line in f]
        cname2lab = {name: label for label, name in enumerate(classnames)}
        return tuple(self.read_data(cname2lab, SPLIT_LISTS[name]) for name in ("train", "val", "test"))

    def read_data(self, cname2lab, list_file):
        """Read lines "IMAGEID VARIANT NAME".

        Image images/IMAGEID.jpg; label = the line of VARIANT NAME in variants.txt.
        """

        def parse_line(line):
            image_id, _, classname = line.strip().partition(" ")
            if not image_id:
                return None
            return classname, os.path.join(self.image_dir, image_id + ".jpg"), classname

        return self.read_list_file(list_file, parse_line, cname2lab, "variant", "variants.txt", "IMAGEID VARIANT NAME")
