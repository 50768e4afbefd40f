"""DataManager, DatasetWrapper and build_data_loader (Dassl's names and behaviour).

Speed: images are decoded and augmented in DATALOADER.NUM_WORKERS worker
processes (never in the training process when NUM_WORKERS > 0); batches go to
pinned memory when CUDA is used; the training loader keeps its workers alive
between epochs (persistent workers), which matters for few-shot epochs of a few
batches, where starting the workers would otherwise dominate. Read without
workers (NUM_WORKERS = 0, as on a CPU), the dataset keeps what the deterministic
start of its transform (decoding included) makes of each image, up to
PREPARED_BUDGET bytes per transform, so that later epochs only run the random
rest (e.g. a flip of the kept normalised tensor); worker processes keep nothing
(each would hold its own copy, and they decode in parallel already).

Randomness: the train loader's RandomSampler and the augmentations draw from
torch's generators, so seeding torch (or restoring a checkpointed torch RNG
state) reproduces an epoch. With NUM_WORKERS = 0 everything draws from torch's
global generator in order, exactly as Dassl does. With workers, the sampler
also draws one 64-bit seed per epoch from the global generator, and the item at
dataset index i is read with torch, `random` and NumPy seeded from (that seed, i),
in whichever worker reads it: an epoch then depends only on the global generator's
state, not on the number of workers or on what the persistent workers did before.
"""
import random

import numpy as np
import torch
from tabulate import tabulate
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import get_worker_info
from torch.utils.data import Sampler

from vlprompt.utils import read_image

from .datasets import build_dataset
from .samplers import build_sampler


def build_data_loader(
    cfg,
    sampler_type="SequentialSampler",
    data_source=None,
    batch_size=64,
    n_domain=0,
    n_ins=2,
    tfm=None,
    is_train=True,
    dataset_wrapper=None,
):
    """Build a torch DataLoader over `data_source`.

    The last incomplete batch is dropped only when training and N >= batch size,
    so a training epoch has floor(N / B) batches when N >= B, else 1.

    Args:
        cfg (CfgNode): reads DATALOADER.NUM_WORKERS, USE_CUDA (and what the wrapper reads).
        sampler_type (str): "RandomSampler" or "SequentialSampler".
        data_source (list[Datum]): items.
        batch_size (int): batch size B.
        n_domain, n_ins (int): passed to the sampler (Dassl signature).
        tfm (callable | list | None): transform(s) given to the wrapper.
        is_train (bool): training loader (drop_last rule, K_TRANSFORMS).
        dataset_wrapper (type | None): wrapper class; default DatasetWrapper.

    Returns:
        torch.utils.data.DataLoader yielding dicts (see DatasetWrapper).

    Raises:
        ValueError: `data_source` is empty, so the loader would have no batch.
    """
    if not data_source:
        role = "training" if is_train else "evaluation"
        raise ValueError(
            f"Cannot build a {role} data loader: the data source is empty (0 items), so it would "
            f"yield no batch. Check the dataset's split files and DATASET.SUBSAMPLE_CLASSES / NUM_SHOTS."
        )
    sampler = build_sampler(
        sampler_type,
        cfg=cfg,
        data_source=data_source,
        batch_size=batch_size,
        n_domain=n_domain,
        n_ins=n_ins,
    )
    wrapper_cls = DatasetWrapper if dataset_wrapper is None else dataset_wrapper
    dataset = wrapper_cls(cfg, data_source, transform=tfm, is_train=is_train)
    num_workers = cfg.DATALOADER.NUM_WORKERS
    extra = {}
    if num_workers > 0:
        dataset, sampler = SeededItems(dataset), SeededSampler(sampler)
        # The loader's own per-iterator seed comes from a private generator, so that keeping the
        # workers alive does not change how many numbers an epoch draws from the global one.
        extra = {"persistent_workers": is_train, "generator": torch.Generator()}
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        drop_last=is_train and len(data_source) >= batch_size,
        pin_memory=torch.cuda.is_available() and cfg.USE_CUDA,
        **extra,
    )


def stop_loader_workers(loader):
    """End the worker processes of ``loader``'s kept iterator (a training loader keeps its workers
    between epochs) now. Left to the garbage collector, such an iterator in a reference cycle (a
    trainer and its loaders are one) ends each of its workers only after a 5 s wait. A later
    iteration starts new workers, which load what the old ones would have (items are seeded by
    index and epoch seed, module docstring). ``loader`` may be None or hold no iterator."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


def _transform(cfg, custom_tfm, is_train):
    """`custom_tfm` if given (announced), else the transform built from INPUT."""
    from .transforms import build_transform

    if custom_tfm is None:
        return build_transform(cfg, is_train=is_train)
    print(f"* Using custom transform for {'training' if is_train else 'testing'}")
    return custom_tfm


class CropBorder:
    """Cut ``pixels`` from every side of a PIL image (a frame that is not part of the photo)."""

    def __init__(self, pixels):
        self.pixels = pixels

    def __call__(self, image):
        width, height = image.size
        return image.crop((self.pixels, self.pixels, width - self.pixels, height - self.pixels))

    def __repr__(self):
        return f"CropBorder(pixels={self.pixels})"


def _with_border_crop(tfm, pixels):
    """``tfm`` (a transform or a list of them) preceded by ``CropBorder(pixels)``; None stays None."""
    import torchvision.transforms as T

    if tfm is None or not pixels:
        return tfm
    if isinstance(tfm, (list, tuple)):
        return [T.Compose([CropBorder(pixels), each]) for each in tfm]
    return T.Compose([CropBorder(pixels), tfm])


class SeededSampler(Sampler):
    """Pairs each index of `sampler` with a seed derived from one draw of torch's global generator per epoch.

    Yields (index, seed) with seed = (epoch seed + index) mod 2**63. Resumable like the
    samplers of :mod:`vlprompt.data.samplers` (its state adds the epoch seed to `sampler`'s).
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.epoch_seed = None
        self._resume = None

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        if self._resume is not None:
            (state, skip), self._resume = self._resume, None
            self.epoch_seed = state["epoch_seed"]
            self.sampler.resume_epoch(state["sampler"], skip)
        else:
            self.epoch_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        for index in self.sampler:
            yield index, (self.epoch_seed + index) % 2**63

    def state_dict(self):
        return {"epoch_seed": self.epoch_seed, "sampler": self.sampler.state_dict()}

    def resume_epoch(self, state, skip):
        """Make the next iteration replay the epoch of ``state`` from position ``skip``, drawing nothing."""
        self._resume = (state, skip)


class SeededItems(TorchDataset):
    """Reads item `index` of `dataset` with torch, `random` and NumPy seeded by the seed sent with it.

    Used inside worker processes, whose generators are private to them.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, seed = key
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        return self.dataset[index]


class DataManager:
    """Builds the dataset, the transforms and the train/val/test loaders.

    Attributes:
        dataset (DatasetBase), train_loader_x, train_loader_u (None unless the
        dataset has train_u), val_loader (None without val), test_loader,
        num_classes (int), num_source_domains (int), lab2cname (dict[int, str]).
    """

    def __init__(self, cfg, custom_tfm_train=None, custom_tfm_test=None, dataset_wrapper=None):
        from vlprompt.clip.preprocess import resolved_input

        cfg = resolved_input(cfg)  # the backbone's preprocessing for empty INPUT keys, before any data is read
        dataset = build_dataset(cfg)
        # A dataset's image_border (e.g. ObjectNet's 1-pixel frame) is cut before any transform.
        tfm_train = _with_border_crop(_transform(cfg, custom_tfm_train, is_train=True), dataset.image_border)
        tfm_test = _with_border_crop(_transform(cfg, custom_tfm_test, is_train=False), dataset.image_border)

        def loader(loader_cfg, data_source, is_train):
            """`build_data_loader` with the sampler and batch size of a DATALOADER node; TEST has
            no N_DOMAIN / N_INS and its sampler gets Dassl's defaults 0 and 2."""
            return build_data_loader(
                cfg,
                sampler_type=loader_cfg.SAMPLER,
                data_source=data_source,
                batch_size=loader_cfg.BATCH_SIZE,
                n_domain=loader_cfg.get("N_DOMAIN", 0),
                n_ins=loader_cfg.get("N_INS", 2),
                tfm=tfm_train if is_train else tfm_test,
                is_train=is_train,
                dataset_wrapper=dataset_wrapper,
            )

        loader_x = cfg.DATALOADER.TRAIN_X
        self.train_loader_x = loader(loader_x, dataset.train_x, is_train=True)
        self.train_loader_u = None
        if dataset.train_u:
            loader_u = loader_x if cfg.DATALOADER.TRAIN_U.SAME_AS_X else cfg.DATALOADER.TRAIN_U
            self.train_loader_u = loader(loader_u, dataset.train_u, is_train=True)
        self.val_loader = loader(cfg.DATALOADER.TEST, dataset.val, is_train=False) if dataset.val else None
        self.test_loader = loader(cfg.DATALOADER.TEST, dataset.test, is_train=False)

        self._num_classes = dataset.num_classes
        self._num_source_domains = len(cfg.DATASET.SOURCE_DOMAINS)
        self._lab2cname = dataset.lab2cname
        self.dataset = dataset

        if cfg.VERBOSE:
            self.show_dataset_summary(cfg)

    @property
    def num_classes(self):
        return self._num_classes

    @property
    def num_source_domains(self):
        return self._num_source_domains

    @property
    def lab2cname(self):
        return self._lab2cname

    def show_dataset_summary(self, cfg):
        """Print the two-column dataset table (tabulate's plain default format)."""
        table = [["Dataset", cfg.DATASET.NAME]]
        if cfg.DATASET.SOURCE_DOMAINS:
            table.append(["Source", cfg.DATASET.SOURCE_DOMAINS])
        if cfg.DATASET.TARGET_DOMAINS:
            table.append(["Target", cfg.DATASET.TARGET_DOMAINS])
        table.append(["# classes", f"{self.num_classes:,}"])
        table.append(["# train_x", f"{len(self.dataset.train_x):,}"])
        if self.dataset.train_u:
            table.append(["# train_u", f"{len(self.dataset.train_u):,}"])
        if self.dataset.val:
            table.append(["# val", f"{len(self.dataset.val):,}"])
        table.append(["# test", f"{len(self.dataset.test):,}"])
        print(tabulate(table))


def _img0_transform(cfg):
    """The "img0" view of DATALOADER.RETURN_IMG0: the image resized to INPUT.SIZE, as a tensor, normalised
    if "normalize" is in INPUT.TRANSFORMS (empty preprocessing keys: the backbone's)."""
    import torchvision.transforms as T

    from vlprompt.clip.preprocess import resolved_input

    from .transforms.transforms import INTERPOLATION_MODES

    cfg = resolved_input(cfg)
    steps = [T.Resize(cfg.INPUT.SIZE, interpolation=INTERPOLATION_MODES[cfg.INPUT.INTERPOLATION]), T.ToTensor()]
    if "normalize" in cfg.INPUT.TRANSFORMS:
        steps.append(T.Normalize(mean=cfg.INPUT.PIXEL_MEAN, std=cfg.INPUT.PIXEL_STD))
    return T.Compose(steps)


PREPARED_BUDGET = 256 * 2**20  # bytes of prepared images a DatasetWrapper keeps (per transform and process)


class PreparedImages:
    """A transform whose deterministic start (decoding included) runs once per image.

    The output of the transform's deterministic leading steps (``split_deterministic``) on an
    image is kept per dataset index while the kept tensors and images stay within ``budget``
    bytes (``budget``, default PREPARED_BUDGET), in the process that reads without data-loader
    workers (a worker keeps nothing); every call gets a copy of it through the transform's random
    rest, so the result is ``tfm(read_image(path))`` drawing the same random numbers.
    """

    def __init__(self, tfm, budget=None):
        from .transforms.transforms import DETERMINISTIC_STEPS, split_deterministic

        self.first, self.rest = split_deterministic(tfm, DETERMINISTIC_STEPS + (CropBorder,))
        self.budget, self.used = PREPARED_BUDGET if budget is None else budget, 0
        self.kept = {}

    def __call__(self, index, read):
        """The transformed image at dataset ``index`` (``read()`` gives the image unless it is kept)."""
        prepared = self.kept.get(index)
        if prepared is None:
            prepared = read()
            if self.first is not None:
                prepared = self.first(prepared)
                size = _size_in_bytes(prepared)
                if size is not None and self.used + size <= self.budget and get_worker_info() is None:
                    self.kept[index] = prepared
                    self.used += size
                    prepared = _copy(prepared)
        else:
            prepared = _copy(prepared)
        return prepared if self.rest is None else self.rest(prepared)

    def __getstate__(self):  # a worker process starts with none kept
        return dict(self.__dict__, kept={}, used=0)


def _size_in_bytes(image):
    """Bytes of a tensor or PIL image, None for anything else (not kept)."""
    if torch.is_tensor(image):
        return image.element_size() * image.nelement()
    size = getattr(image, "size", None)
    mode = getattr(image, "getbands", None)
    if isinstance(size, tuple) and len(size) == 2 and callable(mode):
        return size[0] * size[1] * len(mode()) * 4  # at most 4 bytes per band
    return None


def _copy(image):
    return image.clone() if torch.is_tensor(image) else image.copy()


class DatasetWrapper(TorchDataset):
    """Torch dataset over a list of Datum.

    Item `idx` is a dict with "label" (int), "domain" (int), "impath" (str),
    "index" (int) and "img": the transformed image (a (3, H, W) tensor for the
    built-in transforms; a list of K_TRANSFORMS views when training with
    K_TRANSFORMS > 1; the PIL image when there is no transform). With a list of
    transforms, the i-th one's output is under "img", "img2", "img3", ...
    With DATALOADER.RETURN_IMG0, "img0" holds the image resized to INPUT.SIZE,
    as a tensor, normalised if "normalize" is in INPUT.TRANSFORMS.

    Raises:
        ValueError: K_TRANSFORMS > 1 for training without a transform.
        OSError: (when reading an item) the image file is missing or cannot be
            decoded; the message names the path.
    """

    def __init__(self, cfg, data_source, transform=None, is_train=False):
        self.cfg = cfg
        self.data_source = data_source
        self.transform = transform
        self.is_train = is_train
        self.k_tfm = cfg.DATALOADER.K_TRANSFORMS if is_train else 1
        self.return_img0 = cfg.DATALOADER.RETURN_IMG0

        if self.k_tfm > 1 and transform is None:
            raise ValueError(
                f"Cannot augment the image {self.k_tfm} times (DATALOADER.K_TRANSFORMS) "
                "because transform is None (INPUT.NO_TRANSFORM is set or no transform was given)."
            )

        self.to_tensor = _img0_transform(cfg) if self.return_img0 else None
        # Without img0 the image is only ever transformed: each transform keeps its deterministic start.
        tfms = transform if isinstance(transform, (list, tuple)) else [transform]
        self.prepared = None if transform is None or self.return_img0 else [PreparedImages(t) for t in tfms]

    def __len__(self):
        return len(self.data_source)

    def __getitem__(self, idx):
        item = self.data_source[idx]
        output = {"label": item.label, "domain": item.domain, "impath": item.impath, "index": idx}

        if self.prepared is not None:
            image = []  # the image, read at most once for every view of every transform

            def read():
                if not image:
                    image.append(read_image(item.impath))
                return image[0]

            for i, prepared in enumerate(self.prepared):
                views = [prepared(idx, read) for _ in range(self.k_tfm)]
                output["img" if i == 0 else f"img{i + 1}"] = views[0] if len(views) == 1 else views
            return output

        img0 = read_image(item.impath)
        if self.transform is None:
            output["img"] = img0
        elif isinstance(self.transform, (list, tuple)):
            for i, tfm in enumerate(self.transform):
                output["img" if i == 0 else f"img{i + 1}"] = self._transform_image(tfm, img0)
        else:
            output["img"] = self._transform_image(self.transform, img0)

        if self.return_img0:
            output["img0"] = self.to_tensor(img0)
        return output

    def _transform_image(self, tfm, img0):
        views = [tfm(img0) for _ in range(self.k_tfm)]
        return views[0] if len(views) == 1 else views
