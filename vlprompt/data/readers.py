"""Readers for the raw annotation formats that several datasets share.

- `read_classnames`: ImageNet's `classnames.txt` ("WNID CLASS NAME" per line), also
  copied into the folders of the four ImageNet variants;
- `read_class_folders`: a folder of class folders (WordNet ids) listed into Datum,
  as ImageNet, ImageNet-Sketch, ImageNet-A and ImageNet-R do;
- `ClassFolderTestSet`: the test-only datasets made of such a folder and a copy of
  `classnames.txt` (ImageNet-Sketch, ImageNet-A, ImageNet-R);
- `list_files`: a folder's image files in directory-listing order;
- `load_mat`: MATLAB annotation files (StanfordCars, Flowers102), through SciPy,
  which is imported only when such a file has to be read.
"""
import os

from vlprompt.data.datasets.base_dataset import DATASETS_DOC, DatasetBase, DatasetLayoutError, Datum

CLASSNAMES_FILE = "classnames.txt"


def read_classnames(text_file):
    """Read `classnames.txt`: one "WNID CLASS NAME" line per class.

    The WordNet id ends at the first space; the rest of the line (spaces kept) is
    the class name. Blank lines are skipped.

    Returns:
        dict[str, str]: WNID -> class name, in file order.

    Raises:
        DatasetLayoutError: a non-blank line has no class name after the WNID.
    """
    classnames = {}
    with open(text_file) as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            wnid, _, classname = line.partition(" ")
            if not classname:
                raise DatasetLayoutError(
                    f'{text_file}, line {number}: "{line}" has no class name; each line must be '
                    f'"WNID CLASS NAME" (ImageNet\'s classnames.txt, see {DATASETS_DOC}).'
                )
            classnames[wnid] = classname
    return classnames


def list_files(folder):
    """Paths of the non-hidden files in `folder`, in directory-listing order (not sorted).

    Dassl lists class folders unsorted, so this order (the file system's) decides
    which images few-shot sampling picks; it is kept as is for the same selection.
    """
    with os.scandir(folder) as entries:
        return [entry.path for entry in entries if not entry.name.startswith(".") and entry.is_file()]


def class_folders(image_dir, ignored=()):
    """Sorted names of the non-hidden sub-folders of `image_dir`, minus `ignored`."""
    with os.scandir(image_dir) as entries:
        return sorted(
            entry.name
            for entry in entries
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in ignored
        )


def read_class_folders(image_dir, classnames, classnames_file, folders=None):
    """List a folder of class folders (named by WordNet id) into Datum.

    label = position of the folder in `folders` (default: `class_folders(image_dir)`,
    i.e. sorted); class name = `classnames[folder]`; files in directory-listing order.

    Args:
        image_dir (str): folder holding one sub-folder per class.
        classnames (dict[str, str]): WNID -> class name (`read_classnames`).
        classnames_file (str): where `classnames` comes from, for the error message.
        folders (list[str] | None): class folders in label order.

    Returns:
        list[Datum]: domain 0, grouped by class in label order.

    Raises:
        DatasetLayoutError: a class folder has no line in `classnames_file`.
    """
    folders = class_folders(image_dir) if folders is None else folders
    unknown = [folder for folder in folders if folder not in classnames]
    if unknown:
        shown = ", ".join(unknown[:5])
        raise DatasetLayoutError(
            f"{len(unknown)} class folder(s) of {image_dir} have no line in {classnames_file} "
            f"(first: {shown}); every class folder must be a WordNet id listed there. Copy ImageNet's "
            f"classnames.txt into the dataset folder ({DATASETS_DOC})."
        )
    items = []
    for label, folder in enumerate(folders):
        classname = classnames[folder]
        items.extend(
            Datum.unchecked(path, label, 0, classname) for path in list_files(os.path.join(image_dir, folder))
        )
    return items


def load_mat(path, needed_for):
    """Read a MATLAB .mat file with `scipy.io.loadmat` (SciPy is imported here, lazily).

    Args:
        path (str): the .mat file.
        needed_for (str): what the file is read for, completing "SciPy is needed to ...".

    Returns:
        dict: variable name -> numpy array, as `scipy.io.loadmat` returns it.

    Raises:
        DatasetLayoutError: SciPy is not installed (the message says how to install
            it or how to avoid needing it).
    """
    try:
        from scipy.io import loadmat
    except ImportError:
        raise DatasetLayoutError(
            f"Reading {path} needs SciPy (scipy.io.loadmat), which is not installed. SciPy is needed to "
            f"{needed_for}. Install it (pip install scipy), or put the published split file in place "
            f"({DATASETS_DOC}), which makes the .mat files unnecessary."
        ) from None
    return loadmat(path)


class ClassFolderTestSet(DatasetBase):
    """A test-only dataset: WNID class folders under `image_folder`, named by the dataset's `classnames.txt`.

    Labels are the positions of the folders present, sorted (`read_class_folders`);
    train_x = test = every image; no val, no few-shot, no subsampling.

    Class attributes (besides DatasetBase's):
        image_folder (str): the folder of class folders, inside the dataset folder.
    """

    image_folder = ""

    def __init__(self, cfg):
        self.find_dataset_dir(cfg)
        self.image_dir = os.path.join(self.dataset_dir, self.image_folder)
        classnames_file = os.path.join(self.dataset_dir, CLASSNAMES_FILE)
        data = read_class_folders(self.image_dir, read_classnames(classnames_file), classnames_file)
        super().__init__(train_x=data, test=data)
