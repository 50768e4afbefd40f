"""Predictions of a trained run on any images: ``load_run(RUN_DIR).predict(images)``.

The model is built exactly as ``train.py --eval-only --model-dir RUN_DIR`` builds it: the run's
merged config (``config.yaml``, read through :class:`~vlprompt.engine.run_folder.RunFolder`), the
evaluation scope resolved as an ``--eval-only`` run on the run's own dataset resolves it,
``build_trainer`` and ``load_model`` with the last (or a chosen) epoch's checkpoint. Images are
read by the same data wrappers and test transform as a test split (``DatasetWrapper`` with
``build_transform(cfg, is_train=False)``; a test-time method's ``EpisodeViews``), and scored by
the trainer's own ``parse_batch_test`` / ``model_inference`` inside ``model.evaluation()``; a
test-time method (TPT, RAdaTTT, PromptAlign) runs one adaptation episode per image, as in its
evaluation. So a prediction over a test split is the one ``--eval-only`` makes, image by image.

Classes:

* by default the run's own classes (the run's dataset is built from its config, as eval-only
  builds it: DATASET.ROOT must hold it, ``root=`` overrides the folder);
* ``classes=[...]``: any class names, scored in the ``new`` evaluation scope with
  DATASET.SUBSAMPLE_CLASSES ``new`` (as base-to-novel's test_new run scores the classes the model
  was not trained on). The dataset is not read; the class sentence
  is the run's dataset's template. A method whose classifier is tied to its training classes
  declares why (``unseen_classes_refusal`` on its trainer class) and is refused with that reason.

A test-time method adapts from a training run: ``load_run(SOURCE_RUN, test_time="TPT",
test_time_config="configs/trainers/TPT/synthetic.yaml")`` merges the method's config over the
source run's and loads the source run's checkpoint as ``--model-dir`` does.

An image that cannot be read gives a :class:`Prediction` with ``error`` set, not an exception.
"""
import os
import os.path as osp
from typing import List, Optional, Sequence

from vlprompt.config import ConfigError
from vlprompt.prediction import Prediction, top_classes

__all__ = ["Prediction", "RunPredictor", "load_run", "build_predictor", "IMAGE_EXTENSIONS", "expand_images"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def expand_images(paths: Sequence[str]) -> List[str]:
    """Image files of ``paths``: files as given, folders walked (sorted) for IMAGE_EXTENSIONS files.

    Raises:
        ConfigError: a path that does not exist.
    """
    found = []
    for path in paths:
        if osp.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                found.extend(osp.join(folder, name) for name in sorted(files)
                             if name.lower().endswith(IMAGE_EXTENSIONS))
        elif osp.exists(path):
            found.append(path)
        else:
            raise ConfigError(f'"{path}" is neither an image file nor a folder of images.')
    return found


class ClassList:
    """The part of a dataset a model is built from, for class names given by the user.

    ``template`` and ``image_border`` are class attributes of the run's dataset class (set on a
    subclass by :func:`class_list_data`), as :func:`vlprompt.clip.templates.dataset_template` reads them.
    """

    prediction_map = None

    def __init__(self, classnames):
        self.classnames = list(classnames)
        self.lab2cname = dict(enumerate(self.classnames))
        self.num_classes = len(self.classnames)
        self.train_x, self.train_u, self.val, self.test = [], [], [], []


class ClassListData:
    """A DataManager stand-in that holds a :class:`ClassList` and no loader."""

    train_loader_x = train_loader_u = val_loader = test_loader = None
    num_source_domains = 0

    def __init__(self, dataset):
        self.dataset = dataset
        self.num_classes = dataset.num_classes
        self.lab2cname = dataset.lab2cname


def class_list_data(cfg, classnames):
    """ClassListData of ``classnames`` with the template and image border of DATASET.NAME's class."""
    from vlprompt.clip.templates import DEFAULT_TEMPLATE
    from vlprompt.data.datasets import DATASET_REGISTRY

    dataset_class = DATASET_REGISTRY.get(cfg.DATASET.NAME) if cfg.DATASET.NAME in DATASET_REGISTRY.registered_names() else None
    attributes = {"template": getattr(dataset_class, "template", DEFAULT_TEMPLATE),
                  "image_border": getattr(dataset_class, "image_border", 0)}
    return ClassListData(type("ClassList", (ClassList,), attributes)(classnames))


def build_trainer_on_classes(cfg, data):
    """The trainer of ``cfg.TRAINER.NAME`` built on ``data`` (ClassListData) instead of a DataManager."""
    from vlprompt.engine import TRAINER_REGISTRY
    from vlprompt.engine.test_time import TestTimeTrainer

    trainer_class = TRAINER_REGISTRY.get(cfg.TRAINER.NAME)

    def build_data_loader(self):
        self.dm = data
        # No images: an empty training loader (a per-iteration schedule built with the model, as
        # FLYP's, counts 0 iterations), no other loaders.
        self.train_loader_x = ()
        self.train_loader_u = self.val_loader = self.test_loader = None
        self.num_classes, self.num_source_domains, self.lab2cname = data.num_classes, 0, data.lab2cname
        if isinstance(self, TestTimeTrainer):
            self.throughput = None

    scoring = type(trainer_class.__name__, (trainer_class,), {"build_data_loader": build_data_loader})
    return scoring(cfg)


def check_unseen_classes(trainer_name):
    """ConfigError when the trainer declares that it cannot score class names it was not trained on."""
    from vlprompt.engine import TRAINER_REGISTRY

    reason = TRAINER_REGISTRY.get(trainer_name).unseen_classes_refusal
    if reason:
        raise ConfigError(f"{trainer_name} cannot score class names other than those it was trained on: {reason}. "
                          "Leave out --classes to score the run's own classes.")


def resolve_device(cfg, device):
    """Set USE_CUDA for ``device`` ("cpu", "cuda" or None = the run's setting where CUDA exists).

    Raises:
        ConfigError: another device name, or "cuda" without a CUDA device.
    """
    import torch

    if device is None:
        cfg.USE_CUDA = bool(cfg.USE_CUDA and torch.cuda.is_available())
        return
    if device not in ("cpu", "cuda"):
        raise ConfigError(f'Unknown device "{device}": expected "cpu" or "cuda".')
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError('Device "cuda" was asked for, but torch finds no CUDA device here; use --device cpu.')
    cfg.USE_CUDA = device == "cuda"


class RunPredictor:
    """A built, loaded trainer that scores images (see the module docstring).

    Attributes:
        trainer: the trainer (its model in eval mode, the checkpoint loaded).
        classnames (list of str): the K scored class names, by label.
        batch_size (int): images per batch (DATALOADER.TEST.BATCH_SIZE unless given).
    """

    def __init__(self, trainer, batch_size=None):
        from vlprompt.engine.test_time import TestTimeTrainer

        self.trainer = trainer
        self.cfg = trainer.cfg
        self.test_time = isinstance(trainer, TestTimeTrainer)
        prediction_map = trainer.dm.dataset.prediction_map
        count = trainer.num_classes if prediction_map is None else prediction_map.num_labels
        self.classnames = [trainer.lab2cname[label] for label in range(count)]
        self.batch_size = batch_size or self.cfg.DATALOADER.TEST.BATCH_SIZE
        if self.batch_size < 1:
            raise ConfigError(f"The batch size must be >= 1, got {self.batch_size}.")

    def transform(self):
        """The test transform of the run's config, after the dataset's border crop (as a test split's)."""
        import torchvision.transforms as T

        from vlprompt.data.data_manager import CropBorder
        from vlprompt.data.transforms import build_transform

        tfm = build_transform(self.cfg, is_train=False)
        border = type(self.trainer.dm.dataset).image_border
        return T.Compose([CropBorder(border), tfm]) if border else tfm

    def predict(self, images, topk=5, progress=False) -> List[Prediction]:
        """Top-``topk`` classes of each image.

        Args:
            images: a path (str), a PIL image or a tensor [3, H, W] already transformed (INPUT.SIZE,
                normalised as the run's test transform does), or a list of them; a tensor [N, 3, H, W]
                counts as N images. A test-time method needs paths or PIL images (it augments them).
            topk: classes per image (at most K).
            progress: show a tqdm bar over the batches.

        Returns:
            one Prediction per image, in order.
        """
        logits, errors, sources = self.logits(images, progress=progress)
        return [Prediction(source, error=errors[index]) if index in errors
                else top_classes(source, logits[index], self.classnames, topk)
                for index, source in enumerate(sources)]

    def logits(self, images, progress=False):
        """(logits {index: [K] tensor} of the readable images, errors {index: message}, sources [N])."""
        import torch
        from PIL import Image

        items = _as_list(images)
        sources, errors, readable = [], {}, []
        for index, item in enumerate(items):
            if isinstance(item, (str, os.PathLike)):
                sources.append(str(item))
                error = _unreadable(str(item))
                if error:
                    errors[index] = error
                    continue
            elif isinstance(item, Image.Image):
                sources.append(f"<image {index}>")
            elif isinstance(item, torch.Tensor) and item.dim() == 3:
                if self.test_time:
                    raise ConfigError(f"{self.cfg.TRAINER.NAME} adapts on augmented views of each image: give "
                                      "paths or PIL images, not transformed tensors.")
                sources.append(f"<image {index}>")
            else:
                raise ConfigError(f"Cannot predict item {index} of type {type(item).__name__}: expected a path, "
                                  "a PIL image or a tensor [3, H, W].")
            readable.append(index)
        outputs = {}
        if readable:
            scored = self._score([items[i] for i in readable], progress)
            outputs = dict(zip(readable, scored))
        return outputs, errors, sources

    def _loader(self, items):
        from vlprompt.data import build_data_loader
        from vlprompt.data.datasets import Datum

        if all(isinstance(item, (str, os.PathLike)) for item in items):
            datums = [Datum(impath=str(item), label=0) for item in items]
            if self.test_time:
                return self.trainer.build_views_loader(datums)
            return build_data_loader(self.cfg, "SequentialSampler", datums, batch_size=self.batch_size,
                                     tfm=self.transform(), is_train=False)
        import torch

        return torch.utils.data.DataLoader(_InMemoryImages(items, self._image_input()),
                                           batch_size=self.batch_size, shuffle=False)

    def _image_input(self):
        """(item index, image) -> the "img" entry the trainer's test batches hold."""
        from vlprompt.data.test_time_views import image_seed
        from vlprompt.utils import read_image

        if self.test_time:
            augmenter = self.trainer.view_augmenter()
            seed, root = self.cfg.SEED, self.cfg.DATASET.ROOT
            return lambda index, image: augmenter(
                read_image(image) if isinstance(image, str) else image.convert("RGB"),
                image_seed(seed, f"image-{index}", root))
        tfm = self.transform()
        return lambda index, image: image if not hasattr(image, "convert") else tfm(image.convert("RGB"))

    def _score(self, items, progress):
        """Logits [K] (float32, on the CPU) of each item, after the dataset's prediction map."""
        import torch
        from tqdm import tqdm

        trainer = self.trainer
        prediction_map = trainer.dm.dataset.prediction_map
        trainer.set_model_mode("eval")
        outputs = []
        with torch.no_grad(), trainer.model.evaluation():
            if self.test_time:
                trainer.start_episodes()
            for batch in tqdm(self._loader(items), disable=not progress, desc="Predicting"):
                batch.setdefault("label", torch.zeros(len(batch["img"]), dtype=torch.long))
                inputs, _ = trainer.parse_batch_test(batch)
                output = trainer.model_inference(inputs)
                if prediction_map is not None:
                    output = prediction_map.project(output)
                outputs.extend(output.float().cpu())
        return outputs


class _InMemoryImages:
    """Torch dataset over PIL images or transformed tensors [3, H, W]: items {"img", "label"}."""

    def __init__(self, items, image_input):
        self.items = items
        self.image_input = image_input

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return {"img": self.image_input(index, self.items[index]), "label": 0}


def _as_list(images):
    import torch

    if isinstance(images, torch.Tensor) and images.dim() == 4:
        return list(images)
    if isinstance(images, (list, tuple)):
        return list(images)
    return [images]


def _unreadable(path):
    """Why ``path`` cannot be read as an image ("" when it can)."""
    from vlprompt.utils import read_image

    try:
        read_image(path)
    except OSError as error:
        return str(error) or type(error).__name__
    return ""


def run_config(run_dir, test_time="", test_time_config="", opts=()):
    """(config, last epoch): the config a prediction from ``run_dir`` builds on (not frozen), the
    run's merged config with a test-time method's config merged over it when ``test_time`` names
    one, and the epoch of the run's last checkpoint.

    Raises:
        ConfigError: ``run_dir`` is not a training run folder of this project, or the test-time
            method is unknown or not a test-time method.
    """
    from vlprompt.config import merge_from_file, merge_from_list
    from vlprompt.engine import TRAINER_REGISTRY
    from vlprompt.engine.run_folder import CONFIG_FILENAME, RunFolder
    from vlprompt.engine.test_time import TestTimeTrainer
    from vlprompt_app.project import import_project

    import_project()
    folder = RunFolder(run_dir)
    if not folder.path.is_dir():
        raise ConfigError(f'"{run_dir}" is not a folder: expected the output folder of a training run '
                          f"(train.py --output-dir), holding {CONFIG_FILENAME} and the checkpoints.")
    cfg = folder.read_config()
    names = TRAINER_REGISTRY.registered_names()
    if cfg.TRAINER.NAME not in names:
        raise ConfigError(f'The run in "{run_dir}" was trained with {cfg.TRAINER.NAME!r}, which is not a '
                          f"registered trainer ({', '.join(names)}).")
    last_epoch = TRAINER_REGISTRY.get(cfg.TRAINER.NAME).training_epochs(cfg)
    if test_time:
        if test_time not in names or not issubclass(TRAINER_REGISTRY.get(test_time), TestTimeTrainer):
            ttt = sorted(n for n in names if issubclass(TRAINER_REGISTRY.get(n), TestTimeTrainer))
            raise ConfigError(f"{test_time!r} is not a test-time method; test-time methods: {', '.join(ttt)}.")
        cfg.TRAINER.NAME = test_time
        if test_time_config:
            merge_from_file(cfg, test_time_config)
    merge_from_list(cfg, list(opts))
    return cfg, last_epoch


def build_predictor(cfg, model_dir="", epoch=None, classes=None, device=None, batch_size=None, root=None,
                    scope=None):
    """A RunPredictor of ``cfg`` (not frozen; changed here) with ``model_dir``'s checkpoint loaded.

    Args:
        cfg: a merged config (e.g. :func:`run_config`).
        model_dir: the run folder whose checkpoints are loaded ("" for a method that learns nothing).
        epoch: the checkpoint ``model.pth.tar-EPOCH`` (None: ``model-best.pth.tar``, as load_model).
        classes: class names to score instead of the run's own (the ``new`` scope).
        device: "cpu", "cuda" or None (the run's USE_CUDA where CUDA exists).
        batch_size: images per batch (None: DATALOADER.TEST.BATCH_SIZE).
        root: the datasets folder when the run's classes are read (None: the run's DATASET.ROOT).
        scope: with ``classes``, the evaluation scope they have (an export's own classes); None: "new".
    """
    from vlprompt.engine.config_checks import validate_cfg
    from vlprompt.engine import build_trainer
    from vlprompt.engine.eval_scope import resolve_eval_scope

    resolve_device(cfg, device)
    cfg.FEATURE_CACHE.ENABLED = False  # the cache is keyed by a dataset's splits, not by arbitrary images
    if root:
        cfg.DATASET.ROOT = root
    if classes is not None:
        if scope is None:
            check_unseen_classes(cfg.TRAINER.NAME)
            # Configured as base-to-novel's test_new run, which scores classes the model was not
            # trained on (e.g. PromptKD's teacher is then not held to the training classes' count).
            cfg.DATASET.SUBSAMPLE_CLASSES = "new"
        classes = _checked_classes(classes)
        cfg.TEST.ROLE = scope or "new"
    else:
        cfg.TEST.ROLE = resolve_eval_scope(cfg, eval_only=True, model_dir=model_dir).scope
    validate_cfg(cfg)
    cfg.freeze()
    trainer = build_trainer(cfg) if classes is None else build_trainer_on_classes(cfg, class_list_data(cfg, classes))
    trainer.run_info.update(eval_only=True, model_dir=model_dir, load_epoch=epoch)
    if model_dir:
        trainer.load_model(model_dir, epoch=epoch)
    return RunPredictor(trainer, batch_size)


def _checked_classes(classes):
    names = [str(name).strip() for name in classes]
    if not names or any(not name for name in names):
        raise ConfigError(f"--classes needs one or more non-empty class names, got {list(classes)!r}.")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"--classes names {', '.join(duplicates)} more than once; give each class once.")
    return names


def load_run(run_dir, epoch: Optional[int] = None, classes: Optional[Sequence[str]] = None, device=None,
             batch_size=None, root=None, test_time="", test_time_config="", opts=()) -> RunPredictor:
    """The RunPredictor of a training run folder (see the module docstring).

    Args:
        run_dir: the run's output folder (config.yaml and ``<model>/model.pth.tar-N``).
        epoch: the checkpoint to load (None: the run's last epoch).
        classes: class names to score instead of the run's own (the ``new`` scope).
        device: "cpu" or "cuda" (None: CUDA when the run used it and it is there).
        batch_size: images per batch (None: the run's DATALOADER.TEST.BATCH_SIZE).
        root: datasets folder to read the run's own classes from (None: the run's DATASET.ROOT).
        test_time: a test-time method (TPT, RAdaTTT, PromptAlign) that adapts from this run.
        test_time_config: that method's config file, merged over the run's config.
        opts: KEY VALUE overrides merged last.

    Raises:
        ConfigError: not a run folder, an unknown device, classes a method cannot score.
        FileNotFoundError: the checkpoint is missing (the message lists the ones there).
    """
    cfg, last_epoch = run_config(run_dir, test_time, test_time_config, opts)
    return build_predictor(cfg, model_dir=str(run_dir), epoch=last_epoch if epoch is None else epoch, classes=classes, device=device,
                           batch_size=batch_size, root=root)
