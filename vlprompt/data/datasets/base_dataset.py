"""Datum, DatasetBase and few-shot sampling (Dassl's), plus the layout errors.

`Datum` keeps Dassl's instance attribute names (`_impath`, `_label`, `_domain`,
`_classname`) so that few-shot caches pickled by Dassl map onto it (see
`vlprompt.data.splits`). Few-shot sampling draws from Python's global `random`
generator exactly as Dassl 0.6.3 does, so a seeded run selects the same images.
"""
import os
import random


class DatasetLayoutError(FileNotFoundError):
    """A dataset folder, split file or annotation file is not where the dataset expects it."""


class MissingImagesError(DatasetLayoutError):
    """Images listed by a split file, an annotation file or a cache do not exist."""


class Datum:
    """One sample: an image path, its label, its domain and its class name.

    Args:
        impath (str): path of an existing image file.
        label (int): class label.
        domain (int): domain label (0 for every CoOp-family dataset).
        classname (str): class name.

    Raises:
        TypeError: `impath` is not a string.
        FileNotFoundError: no file exists at `impath`.
    """

    def __init__(self, impath="", label=0, domain=0, classname=""):
        if not isinstance(impath, str):
            raise TypeError(f"Datum expects impath to be a str, got {type(impath).__name__}: {impath!r}")
        if not os.path.isfile(impath):
            raise FileNotFoundError(f'No image file found at "{impath}"')
        self._impath = impath
        self._label = label
        self._domain = domain
        self._classname = classname

    @classmethod
    def unchecked(cls, impath, label, domain, classname):
        """Create a Datum without checking that the file exists.

        For items whose files were already checked (in bulk, or when the item was
        first read) and for relabelled copies made by base/new subsampling.
        """
        item = cls.__new__(cls)
        item._impath = impath
        item._label = label
        item._domain = domain
        item._classname = classname
        return item

    @property
    def impath(self):
        return self._impath

    @property
    def label(self):
        return self._label

    @property
    def domain(self):
        return self._domain

    @property
    def classname(self):
        return self._classname

    def __repr__(self):
        return (
            f"Datum(impath={self._impath!r}, label={self._label}, "
            f"domain={self._domain}, classname={self._classname!r})"
        )


def split_dataset_by_label(data_source):
    """Group items by label.

    Args:
        data_source (list[Datum]): items.

    Returns:
        dict[int, list[Datum]]: keys in order of each label's first appearance,
        items in their original order.
    """
    groups = {}
    for item in data_source:
        groups.setdefault(item.label, []).append(item)
    return groups


def split_dataset_by_domain(data_source):
    """Group items by domain; same ordering rules as `split_dataset_by_label`."""
    groups = {}
    for item in data_source:
        groups.setdefault(item.domain, []).append(item)
    return groups


def generate_fewshot_dataset(*data_sources, num_shots=-1, repeat=False):
    """Sample `num_shots` items per class from each list (bit-exact with Dassl).

    Classes are visited in order of first appearance; a class with at least K
    items contributes `random.sample(items, K)`; a smaller class contributes
    `random.choices(items, k=K)` if `repeat`, else all its items (no draw).

    Args:
        *data_sources (list[Datum]): one or more lists.
        num_shots (int): K; below 1 the inputs are returned unchanged.
        repeat (bool): sample with replacement for classes with fewer than K items.

    Returns:
        list[Datum] if one list was given, else a list of lists (a tuple of the
        unchanged inputs when K < 1).
    """
    if num_shots < 1:
        return data_sources[0] if len(data_sources) == 1 else data_sources

    print(f"Creating a {num_shots}-shot dataset")
    outputs = []
    for data_source in data_sources:
        sampled = []
        for items in split_dataset_by_label(data_source).values():
            if len(items) >= num_shots:
                sampled.extend(random.sample(items, num_shots))
            elif repeat:
                sampled.extend(random.choices(items, k=num_shots))
            else:
                sampled.extend(items)
        outputs.append(sampled)
    return outputs[0] if len(outputs) == 1 else outputs


DATASETS_DOC = "DATASETS.md"


def dataset_root(cfg):
    """DATASET.ROOT with "~" expanded, made absolute (the current folder when empty)."""
    return os.path.abspath(os.path.expanduser(cfg.DATASET.ROOT))


def _root_text(cfg):
    """How DATASET.ROOT was resolved, for layout errors."""
    if cfg.DATASET.ROOT:
        return f'DATASET.ROOT is "{cfg.DATASET.ROOT}" (resolved to {dataset_root(cfg)})'
    return f"DATASET.ROOT is empty, so the current folder {dataset_root(cfg)} was searched (set --root)"


def _format_layout_error(dataset_name, problem, layout, root_text=None):
    """One paragraph naming the dataset, the problem, DATASET.ROOT and DATASETS.md, then the expected tree."""
    where = f"; {root_text}" if root_text else ""
    message = (
        f"Dataset {dataset_name}: {problem}{where}. {DATASETS_DOC} says where to get the dataset and "
        "how to lay it out (python tools/check_datasets.py --root DATA checks a data folder)."
    )
    if layout:
        message += f"\nExpected layout under DATASET.ROOT:\n{layout}"
    return message


def layout_gaps(dataset_dir, required=(), split_file=None, split_sources=()):
    """What a dataset folder lacks, as short phrases ([] when complete).

    Args:
        dataset_dir (str): the dataset folder.
        required (sequence[str]): relative paths that must exist.
        split_file (str | None): the split JSON; when it is missing, every path
            in `split_sources` must exist (the split is then built from them).
        split_sources (sequence[str]): relative paths needed to build the split.
    """
    missing = [p for p in required if not os.path.exists(os.path.join(dataset_dir, p))]
    if split_file is not None and not os.path.isfile(os.path.join(dataset_dir, split_file)):
        missing_sources = [p for p in split_sources if not os.path.exists(os.path.join(dataset_dir, p))]
        if missing_sources:
            missing.append(f"{split_file} (or, to build it, {', '.join(missing_sources)})")
    return missing


class DatasetBase:
    """A dataset: the train_x / train_u / val / test lists of Datum.

    Class attributes of subclasses, the dataset's own facts (the expected layout, read by
    `find_dataset_dir` and by tools/check_datasets.py; the text facts, listed by
    tools/dataset_matrix.py):
        dataset_dir (str): folder name under DATASET.ROOT (an instance attribute
            of the same name holds the absolute folder once constructed).
        dataset_dir_aliases (tuple[str]): other folder names, tried in order after `dataset_dir`.
        required_paths (tuple[str]): paths relative to the dataset folder that must exist.
        split_file (str | None): the split JSON (`split_zhou_<Name>.json`), if the dataset has one.
        split_sources (tuple[str]): relative paths the split is built from when `split_file` is missing.
        layout (str): the expected folder tree, printed by layout errors.
        template (str): the zero-shot prompt template, one "{}" for the class name (optional;
            trainers fall back to "a photo of a {}.").
        description_stem (str): the file stem of its per-class descriptions, ``<stem>_prompt.json``
            (vlprompt.data.descriptions; upstream TAC's stems, e.g. "fgvc"); "" when none is known.
        published_sizes (tuple | None): (train, val, test) image counts of the published
            split (val None when there is none), for installation checks.
        domains (list[str]): domain names (DA/DG datasets only).
        prediction_map (PredictionMap | None): set (on the instance) by test sets scored
            through another dataset's classes (ObjectNet through ImageNet's); see
            vlprompt.data.prediction_map.
        image_border (int): pixels cut from every side of an image when it is read (0: none;
            ObjectNet's images carry a 1-pixel border that is not part of the photo).
    """

    dataset_dir = ""
    dataset_dir_aliases = ()
    required_paths = ()
    split_file = None
    split_sources = ()
    layout = ""
    description_stem = ""
    published_sizes = None
    domains = []
    prediction_map = None
    image_border = 0

    def __init__(self, train_x=None, train_u=None, val=None, test=None):
        if not train_x:
            raise ValueError(
                f"{type(self).__name__}: train_x is empty; a dataset needs at least one training "
                "item to define its classes (check the split file and DATASET.SUBSAMPLE_CLASSES)."
            )
        self._train_x = train_x
        self._train_u = train_u
        self._val = val
        self._test = test
        self._num_classes = self.get_num_classes(train_x)
        self._lab2cname, self._classnames = self.get_lab2cname(train_x)

    @property
    def train_x(self):
        return self._train_x

    @property
    def train_u(self):
        return self._train_u

    @property
    def val(self):
        return self._val

    @property
    def test(self):
        return self._test

    @property
    def lab2cname(self):
        return self._lab2cname

    @property
    def classnames(self):
        return self._classnames

    @property
    def num_classes(self):
        return self._num_classes

    @staticmethod
    def get_num_classes(data_source):
        """Largest label + 1 (int)."""
        return max(item.label for item in data_source) + 1

    @staticmethod
    def get_lab2cname(data_source):
        """Return (dict label -> classname, list of classnames ordered by label)."""
        mapping = {item.label: item.classname for item in data_source}
        labels = sorted(mapping)
        return mapping, [mapping[label] for label in labels]

    def check_input_domains(self, source_domains, target_domains):
        """Raise ValueError unless every source/target domain is one of `self.domains`."""
        self.is_input_domain_valid(source_domains)
        self.is_input_domain_valid(target_domains)

    def is_input_domain_valid(self, input_domains):
        for domain in input_domains:
            if domain not in self.domains:
                raise ValueError(f"Input domain must belong to {self.domains}, but got [{domain}]")

    def download_data(self, url, dst, from_gdrive=True):
        raise NotImplementedError(
            f"{type(self).__name__}: vlprompt does not download datasets; fetch {url} yourself "
            f"and unpack it to {os.path.dirname(dst)} (see the dataset's expected layout)."
        )

    split_dataset_by_label = staticmethod(split_dataset_by_label)
    split_dataset_by_domain = staticmethod(split_dataset_by_domain)

    def generate_fewshot_dataset(self, *data_sources, num_shots=-1, repeat=False):
        """See the module function `generate_fewshot_dataset`."""
        return generate_fewshot_dataset(*data_sources, num_shots=num_shots, repeat=repeat)

    @classmethod
    def folder_names(cls):
        """Folder names the dataset may have under DATASET.ROOT, in lookup order."""
        return [cls.dataset_dir, *cls.dataset_dir_aliases]

    @classmethod
    def locate(cls, root, folders=None):
        """The first of `folders` (default `folder_names()`) that is a folder under `root`, or None."""
        for folder in folders or cls.folder_names():
            path = os.path.join(root, folder)
            if os.path.isdir(path):
                return path
        return None

    def find_dataset_dir(self, cfg, required=None, split_file=None, split_sources=None, folders=None):
        """Find the dataset folder under DATASET.ROOT and check its layout.

        Sets the instance attribute `dataset_dir` to the absolute folder, as Dassl's
        datasets do (the class attribute keeps the folder name).

        Args:
            cfg (CfgNode): reads DATASET.ROOT ("~" expanded, made absolute).
            required, split_file, split_sources: override the class attributes
                `required_paths`, `split_file`, `split_sources` (see `layout_gaps`).
            folders (sequence[str] | None): candidate folder names, tried in order;
                default: `folder_names()`.

        Returns:
            str: the absolute dataset folder.

        Raises:
            DatasetLayoutError: the folder or a required file/folder is missing; the
                message names the dataset, DATASET.ROOT, what is missing, points to
                DATASETS.md and shows `layout`.
        """
        cls = type(self)
        name = cls.__name__
        root = dataset_root(cfg)
        folders = list(folders) if folders else cls.folder_names()

        dataset_dir = cls.locate(root, folders)
        if dataset_dir is None:
            tried = " or ".join(f'"{f}"' for f in folders)
            problem = f"no folder {tried} found"
            raise DatasetLayoutError(_format_layout_error(name, problem, self.layout, _root_text(cfg)))

        missing = layout_gaps(
            dataset_dir,
            cls.required_paths if required is None else required,
            cls.split_file if split_file is None else split_file,
            cls.split_sources if split_sources is None else split_sources,
        )
        if missing:
            problem = f"the folder {dataset_dir} lacks {'; '.join(missing)}"
            raise DatasetLayoutError(_format_layout_error(name, problem, self.layout, _root_text(cfg)))

        self.dataset_dir = dataset_dir
        return dataset_dir

    def layout_error(self, problem):
        """A DatasetLayoutError for `problem` (a phrase naming the path), in `find_dataset_dir`'s form."""
        return DatasetLayoutError(_format_layout_error(type(self).__name__, problem, self.layout))
