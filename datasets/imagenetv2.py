"""ImageNetV2 matched-frequency, a new test set of the 1000 ImageNet classes (test only)."""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from vlprompt.data.readers import class_folders, list_files, read_classnames

IMAGE_FOLDER = "imagenetv2-matched-frequency-format-val"


@DATASET_REGISTRY.register()
class ImageNetV2(DatasetBase):
    """ImageNet's 1,000 classes; folder "i" holds label i, named by line i of classnames.txt.

    train_x = test = every image; no val, no few-shot, no subsampling.
    """

    dataset_dir = "imagenetv2"
    required_paths = (IMAGE_FOLDER, "classnames.txt")
    template = "a photo of a {}."
    description_stem = "imagenetv2"
    published_sizes = (None, None, 10000)
    layout = f"""\
imagenetv2/
  {IMAGE_FOLDER}/0/<hash>.jpeg … 999/…
  classnames.txt      (a copy of ImageNet's; line i names folder i)"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, IMAGE_FOLDER)
        classnames_file = os.path.join(self.dataset_dir, "classnames.txt")
        classnames = list(read_classnames(classnames_file).values())

        expected = {str(label) for label in range(len(classnames))}
        found = set(class_folders(self.image_dir))
        if found != expected:
            missing = sorted(expected - found, key=int)[:5]
            extra = sorted(found - expected)[:5]
            raise self.layout_error(
                f"{self.image_dir} must hold exactly the folders 0 … {len(classnames) - 1}, one per line of "
                f"{classnames_file}; missing: {missing or 'none'}, unexpected: {extra or 'none'}"
            )
        data = [
            Datum.unchecked(path, label, 0, classname)
            for label, classname in enumerate(classnames)
            for path in list_files(os.path.join(self.image_dir, str(label)))
        ]
        super().__init__(train_x=data, test=data)

