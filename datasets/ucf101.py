"""UCF101 action recognition (one middle frame per video, 101 classes)."""
import os
import re

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.data.splits import CoopSplitDataset, split_official_lists

LIST_DIR = "ucfTrainTestlist"
CLASS_INDEX = f"{LIST_DIR}/classInd.txt"
SPLIT_LISTS = (f"{LIST_DIR}/trainlist01.txt", f"{LIST_DIR}/testlist01.txt")


def renamed_action(action):
    """The frame folder of an action: split before each capital and join with "_".

    "ApplyEyeMakeup" -> "Apply_Eye_Makeup", "YoYo" -> "Yo_Yo".
    """
    return "_".join(re.findall("[A-Z][^A-Z]*", action))


@DATASET_REGISTRY.register()
class UCF101(CoopSplitDataset):
    """101 actions; the split is built from the official split 1 when the JSON is missing."""

    dataset_dir = "ucf101"
    image_folder = "UCF-101-midframes"
    required_paths = ("UCF-101-midframes",)
    split_file = "split_zhou_UCF101.json"
    split_sources = (CLASS_INDEX, *SPLIT_LISTS)
    template = "a photo of a person doing {}."
    description_stem = "ucf101"
    published_sizes = (7639, 1898, 3783)
    layout = """\
ucf101/
  UCF-101-midframes/Apply_Eye_Makeup/v_ApplyEyeMakeup_g01_c01.jpg …
  ucfTrainTestlist/classInd.txt, trainlist01.txt, testlist01.txt   (only needed to build the split)
  split_zhou_UCF101.json
  split_fewshot/"""

    def build_split(self):
        """Label = INDEX - 1 from classInd.txt ("INDEX ACTION" lines).

        trainlist01 is split 80 % / 20 % into train / val; testlist01 is test.
        """
        cname2lab = {}
        with open(os.path.join(self.dataset_dir, CLASS_INDEX)) as f:
            for line in f:
                if line.strip():
                    index, action = line.split()
                    cname2lab[action] = int(index) - 1
        return split_official_lists(lambda list_file: self.read_data(cname2lab, list_file), *SPLIT_LISTS)

    def read_data(self, cname2lab, list_file):
        """Read a split list: lines "ACTION/VIDEO.avi [LABEL]" -> UCF-101-midframes/<Renamed_Action>/VIDEO.jpg."""

        def parse_line(line):
            fields = line.split()
            if not fields:
                return None
            action, video = fields[0].split("/")
            folder = renamed_action(action)
            return action, os.path.join(self.image_dir, folder, video.replace(".avi", ".jpg")), folder

        return self.read_list_file(list_file, parse_line, cname2lab, "action", CLASS_INDEX, "ACTION/VIDEO.avi [LABEL]")
