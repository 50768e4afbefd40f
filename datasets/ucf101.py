"""UCF101 action recognition (one middle frame per video), datasets.md §3.11."""
import os
import re

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase
from vlprompt.data.splits import build_datums, prepare_coop_splits, split_trainval

LIST_DIR = "ucfTrainTestlist"
CLASS_INDEX = f"{LIST_DIR}/classInd.txt"
SPLIT_LISTS = (f"{LIST_DIR}/trainlist01.txt", f"{LIST_DIR}/testlist01.txt")


def renamed_action(action):
    """The frame folder of an action: split before each capital and join with "_".

    "ApplyEyeMakeup" -> "Apply_Eye_Makeup", "YoYo" -> "Yo_Yo".
    """
    return "_".join(re.findall("[A-Z][^A-Z]*", action))


@DATASET_REGISTRY.register()
class UCF101(DatasetBase):
    """101 actions; the split is built from the official split 1 when the JSON is missing."""

    dataset_dir = "ucf101"
    required_paths = ("UCF-101-midframes",)
    split_file = "split_zhou_UCF101.json"
    split_sources = (CLASS_INDEX, *SPLIT_LISTS)
    template = "a photo of a person doing {}."
    published_sizes = (7639, 1898, 3783)
    layout = """\
ucf101/
  UCF-101-midframes/Apply_Eye_Makeup/v_ApplyEyeMakeup_g01_c01.jpg …
  ucfTrainTestlist/classInd.txt, trainlist01.txt, testlist01.txt   (only needed to build the split)
  split_zhou_UCF101.json
  split_fewshot/"""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, "UCF-101-midframes")
        self.split_path = os.path.join(self.dataset_dir, self.split_file)

        train, val, test = prepare_coop_splits(
            cfg, self.dataset_dir, self._build_split, self.split_path, self.image_dir
        )
        super().__init__(train_x=train, val=val, test=test)

    def _build_split(self):
        """Label = INDEX - 1 from classInd.txt ("INDEX ACTION" lines).

        trainlist01 is split 80 % / 20 % into train / val; testlist01 is test.
        """
        cname2lab = {}
        with open(os.path.join(self.dataset_dir, CLASS_INDEX)) as f:
            for line in f:
                if line.strip():
                    index, action = line.split()
                    cname2lab[action] = int(index) - 1
        trainval = self.read_data(cname2lab, SPLIT_LISTS[0])
        test = self.read_data(cname2lab, SPLIT_LISTS[1])
        train, val = split_trainval(trainval)
        return train, val, test

    def read_data(self, cname2lab, list_file):
        """Read a split list: lines "ACTION/VIDEO.avi [LABEL]" -> UCF-101-midframes/<Renamed_Action>/VIDEO.jpg."""
        filepath = os.path.join(self.dataset_dir, list_file)
        records = []
        with open(filepath) as f:
            for number, line in enumerate(f, start=1):
                fields = line.split()
                if not fields:
                    continue
                action, video = fields[0].split("/")
                if action not in cname2lab:
                    raise self.layout_error(
                        f'{filepath}, line {number}: the action "{action}" is not listed in '
                        f"{os.path.join(self.dataset_dir, CLASS_INDEX)}"
                    )
                folder = renamed_action(action)
                impath = os.path.join(self.image_dir, folder, video.replace(".avi", ".jpg"))
                records.append((impath, cname2lab[action], folder))
        return build_datums(records, filepath)
