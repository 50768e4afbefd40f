"""ObjectNet, its 113 classes that overlap ImageNet (test only), scored through ImageNet's 1,000 classes.

The official release (objectnet.mit.edu, `objectnet-1.0.zip`) holds 313 class folders of PNG
images and, in `mappings/`, the files that relate its classes to ImageNet's:

* `folder_to_objectnet_label.json`: folder name -> ObjectNet class name (313 entries);
* `objectnet_to_imagenet_1k.json`: ObjectNet class name -> the ImageNet class names it covers,
  joined by "; " (the 113 classes that overlap ImageNet);
* `imagenet_to_label_2012_v2`: one ImageNet class name per line, in ILSVRC-2012 id order;
* `pytorch_to_imagenet_2012_id.json`: ImageNet label (the position of the WNID in sorted
  order, as torchvision and our ImageNet number them) -> line of `imagenet_to_label_2012_v2`.

Evaluation follows WiSE-FT / FLYP: the model predicts over ImageNet's 1,000 classes (named by
ImageNet's classnames.txt, copied into the dataset folder as for the ImageNet variants), and a
prediction is correct when it is one of the ImageNet classes of the image's ObjectNet class;
classes that belong to no ObjectNet class are ignored (vlprompt.data.prediction_map).
"""
import json
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from vlprompt.data.prediction_map import PredictionMap
from vlprompt.data.readers import class_folders, list_files, read_classnames

RELEASE = "objectnet-1.0"
FOLDER_TO_LABEL = f"{RELEASE}/mappings/folder_to_objectnet_label.json"
TO_IMAGENET = f"{RELEASE}/mappings/objectnet_to_imagenet_1k.json"
IMAGENET_NAMES = f"{RELEASE}/mappings/imagenet_to_label_2012_v2"
IMAGENET_INDEX = f"{RELEASE}/mappings/pytorch_to_imagenet_2012_id.json"
IMAGENET_NAME_SEPARATOR = "; "


@DATASET_REGISTRY.register()
class ObjectNet(DatasetBase):
    """The 113 ObjectNet classes mapped to ImageNet; labels follow their folder names, sorted.

    train_x = test = every image of those classes; no val, no few-shot, no subsampling. Class
    names are ObjectNet's ("Alarm clock"); ``prediction_map`` scores ImageNet's 1,000 classes
    and counts each as its ObjectNet class (-1 for the ImageNet classes ObjectNet lacks).
    Images lose their 1-pixel border (``image_border``) when read.

    Attributes:
        imagenet_labels (list[list[int]]): for each label, its ImageNet labels (ascending).
    """

    dataset_dir = "objectnet"
    required_paths = (f"{RELEASE}/images", FOLDER_TO_LABEL, TO_IMAGENET, IMAGENET_NAMES, IMAGENET_INDEX,
                      "classnames.txt")
    template = "a photo of a {}."
    published_sizes = (None, None, 18574)
    image_border = 1
    layout = f"""\
objectnet/
  {RELEASE}/             (the official release, unzipped)
    images/<folder>/<hash>.png … (313 class folders; the 113 mapped to ImageNet are read)
    mappings/folder_to_objectnet_label.json, objectnet_to_imagenet_1k.json,
             imagenet_to_label_2012_v2, pytorch_to_imagenet_2012_id.json
  classnames.txt          (ImageNet's full 1,000-line file)"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, RELEASE, "images")
        imagenet_classnames = self._imagenet_classnames()
        index_of_name = self._imagenet_index_of_name(len(imagenet_classnames))

        folder_to_label = self._read_json(FOLDER_TO_LABEL)
        folder_of_label = {name: folder for folder, name in folder_to_label.items()}
        to_imagenet = self._read_json(TO_IMAGENET)
        unknown = sorted(set(to_imagenet) - set(folder_of_label))
        if unknown:
            raise self.layout_error(f"{TO_IMAGENET} names ObjectNet classes that {FOLDER_TO_LABEL} lacks: {unknown[:5]}")
        folders = sorted(folder_of_label[name] for name in to_imagenet)
        missing = sorted(set(folders) - set(class_folders(self.image_dir)))
        if missing:
            raise self.layout_error(
                f"{self.image_dir} lacks {len(missing)} of the {len(folders)} class folders mapped to ImageNet "
                f"(first: {', '.join(missing[:5])}); unzip the complete release"
            )

        self.imagenet_labels = []
        for folder in folders:
            names = to_imagenet[folder_to_label[folder]].split(IMAGENET_NAME_SEPARATOR)
            not_found = [name for name in names if name not in index_of_name]
            if not_found:
                raise self.layout_error(f"{TO_IMAGENET} maps to ImageNet names absent from {IMAGENET_NAMES}: {not_found[:5]}")
            self.imagenet_labels.append(sorted({index for name in names for index in index_of_name[name]}))
        counts_as = [-1] * len(imagenet_classnames)
        for label, indices in enumerate(self.imagenet_labels):
            for index in indices:
                counts_as[index] = label
        self.prediction_map = PredictionMap(imagenet_classnames, counts_as, len(folders))

        data = [
            Datum.unchecked(path, label, 0, folder_to_label[folder])
            for label, folder in enumerate(folders)
            for path in list_files(os.path.join(self.image_dir, folder))
        ]
        super().__init__(train_x=data, test=data)

    def _read_json(self, relative):
        path = os.path.join(self.dataset_dir, relative)
        try:
            with open(path) as f:
                content = json.load(f)
        except json.JSONDecodeError as error:
            raise self.layout_error(f"{path} is not valid JSON ({error})") from None
        if not isinstance(content, dict):
            raise self.layout_error(f"{path} must hold a JSON object, got {type(content).__name__}")
        return content

    def _imagenet_classnames(self):
        """ImageNet's class names in label order (WNIDs sorted), from the copy of classnames.txt."""
        names = read_classnames(os.path.join(self.dataset_dir, "classnames.txt"))
        return [names[wnid] for wnid in sorted(names)]

    def _imagenet_index_of_name(self, num_imagenet):
        """ImageNet class name (as in imagenet_to_label_2012_v2) -> its ImageNet labels.

        A name written on two lines (ImageNet has two "crane"s and two "maillot"s) maps to both.
        """
        with open(os.path.join(self.dataset_dir, IMAGENET_NAMES)) as f:
            lines = [line.strip() for line in f if line.strip()]
        line_of_index = self._read_json(IMAGENET_INDEX)
        expected = {str(index) for index in range(num_imagenet)}
        if set(line_of_index) != expected or len(lines) != num_imagenet:
            raise self.layout_error(
                f"{IMAGENET_INDEX} must map each ImageNet label 0..{num_imagenet - 1} (one per line of classnames.txt) "
                f"to a line of {IMAGENET_NAMES}; it has {len(line_of_index)} entries and the file {len(lines)} lines"
            )
        index_of_name = {}
        for index, line in line_of_index.items():
            if not isinstance(line, int) or not 0 <= line < len(lines):
                raise self.layout_error(f"{IMAGENET_INDEX}: ImageNet label {index} points to line {line!r}, not a line number")
            index_of_name.setdefault(lines[line], []).append(int(index))
        return index_of_name
