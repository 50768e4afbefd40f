"""Image features of a frozen image encoder, computed once and read back (RAda's frozen-encoder training).

A trainer whose image encoder never changes (RAda EFT, CLIP-Adapter, zero-shot CLIP, linear
probes) spends nearly all its time encoding images one small batch at a time. The cache
encodes every view up front, in batches of ``FEATURE_CACHE.BATCH_SIZE`` images, and training
and evaluation then read features.

Training views (:meth:`FeatureCache.train_epochs`). The real training loader is iterated for
every remaining epoch, exactly as training would iterate it (same sampler, transforms, batch
size, workers), starting from torch's current random state. So the cached epochs hold the
very views, in the very order, that the uncached run would see: same augmentation
distribution and number of views, and, when the training step itself draws no random
numbers from torch's CPU generator (RAda, CLIP-Adapter), the same trained parameters. While
replaying, the CPU generator is set at the end of each epoch to the state the uncached run
has there, so checkpoints hold the same RNG states and resuming stays exact. Each epoch's views
are encoded in batches of their own (the first view of an epoch starts an encoder batch): the
encoder's output depends on its batch to the last bit, and a run resumed from a checkpoint caches
fewer epochs, so an epoch's features must not depend on the epochs cached before it.

Evaluation views (:meth:`FeatureCache.eval_loader`): the deterministic test transform over a
sequential loader, encoded once per split.

Keys and storage. An entry is identified by the SHA-256 of its key fields: dataset name,
split, the items (paths, labels, file sizes and modification times), backbone name and
weights (files by path, size and modification time), the encoding method, the autocast
dtype, the transform, and for training also the loader settings, SEED, the epoch range
and a digest of torch's CPU random state at the first cached epoch (which, with a fixed
seed, is fixed by the seed and by what the run drew before training). Any change gives
another file, so a changed transform or seed never reads stale features. Files are
``<DIR>/<dataset>/<split>-<key>.pt`` (DIR: FEATURE_CACHE.DIR, by default
``<DATASET.ROOT>/feature_cache``, or ``feature_cache`` in the generated-files folder of a root
that cannot be written or of DATASET.CACHE_DIR: :mod:`vlprompt.data.generated_files`), written atomically
with ``torch.save`` and read with ``torch.load(weights_only=True)`` (tensors and plain
values only); the key fields stored inside are compared on reading. Unseeded runs (SEED < 0)
keep their training features in memory only, since nobody could reuse them.
"""
import hashlib
import json
import os
import os.path as osp

import torch

from vlprompt.data.data_manager import stop_loader_workers
from vlprompt.data.generated_files import generated_files_dir
from vlprompt.utils import atomic_write

__all__ = ["FeatureCache", "CachedTrainEpochs", "CachedEvalLoader", "FORMAT_VERSION"]

FORMAT_VERSION = 2  # 2: each training epoch's views start a new encoder batch


def _digest(value):
    """SHA-256 hex digest of ``value`` (a JSON-serialisable object)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def _file_identity(path):
    """[absolute path, size, mtime_ns] of an existing file, else the string as given."""
    if path and osp.isfile(path):
        stat = os.stat(path)
        return [osp.abspath(path), stat.st_size, stat.st_mtime_ns]
    return path


def _dataset_wrapper(loader):
    """The DatasetWrapper behind a loader of ``build_data_loader`` (also inside its worker-seeding wrapper)."""
    dataset = loader.dataset
    while not hasattr(dataset, "data_source"):
        dataset = dataset.dataset
    return dataset


def _loader_items(loader):
    """Digest of the items behind a loader built by ``build_data_loader``: path, label, and the
    file's size and modification time (an image rewritten in place changes the key)."""
    items = [[item.impath, item.label, *_file_identity(item.impath)[1:]]
             for item in _dataset_wrapper(loader).data_source]
    return {"count": len(items), "sha256": _digest(items)}


class _ChunkedEncoder:
    """Collects image batches and encodes them ``batch_size`` images at a time.

    Args:
        encode: images [N, 3, H, W] -> features [N, E] (the model's frozen image encoder).
        batch_size: images per encoder call.
        device: where images are encoded.
        autocast: context-manager factory used around the encoder (the trainer's).
    """

    def __init__(self, encode, batch_size, device, autocast):
        self.encode, self.batch_size, self.device, self.autocast = encode, batch_size, device, autocast
        self.pending, self.pending_count, self.features = [], 0, []

    def add(self, images):
        self.pending.append(images)
        self.pending_count += images.shape[0]
        while self.pending_count >= self.batch_size:
            self._encode(self.batch_size)

    def flush(self):
        """Encode the images added so far, however few, so that the next image starts an encoder batch."""
        if self.pending_count:
            self._encode(self.pending_count)

    def finish(self):
        """All features [N, E] on the CPU, in the order images were added."""
        self.flush()
        features, self.features = self.features, []
        return torch.cat(features) if features else torch.empty(0)

    @torch.no_grad()
    def _encode(self, count):
        images = torch.cat(self.pending)
        batch, rest = images[:count], images[count:]
        self.pending, self.pending_count = ([rest] if rest.shape[0] else []), rest.shape[0]
        with self.autocast():
            features = self.encode(batch.to(self.device))
        self.features.append(features.detach().cpu())


class CachedTrainEpochs:
    """Stand-in for the training loader that replays cached epochs.

    ``len()`` is the number of batches per epoch; iterating yields, for the trainer's current
    epoch, dicts with "features" [B, E], "label" [B] and "index" [B] (dataset positions), then
    sets torch's CPU generator to the state the uncached run has after that epoch.

    Args:
        entry: the cache entry (dict of tensors, see ``FeatureCache.train_epochs``).
        current_epoch: callable returning the trainer's 0-based epoch.
        device: where features are kept.
    """

    def __init__(self, entry, current_epoch, device):
        self.first_epoch = entry["first_epoch"]
        self.features = entry["features"].to(device)
        self.labels = entry["labels"]
        self.indices = entry["indices"]
        self.batch_sizes = entry["batch_sizes"]  # [epochs, batches]
        self.rng_after_epoch = entry["rng_after_epoch"]  # [epochs, state bytes]
        self.current_epoch = current_epoch
        self.batches_per_epoch = self.batch_sizes.shape[1]
        self.items_per_epoch = int(self.batch_sizes[0].sum())

    def __len__(self):
        return self.batches_per_epoch

    def __iter__(self):
        epoch = self.current_epoch() - self.first_epoch
        if not 0 <= epoch < self.batch_sizes.shape[0]:
            raise RuntimeError(
                f"The feature cache holds epochs {self.first_epoch + 1}..{self.first_epoch + self.batch_sizes.shape[0]}, "
                f"but epoch {self.current_epoch() + 1} was requested."
            )
        start = epoch * self.items_per_epoch
        for size in self.batch_sizes[epoch].tolist():
            stop = start + size
            labels = self.labels[start:stop]
            yield {"features": self.features[start:stop], "label": labels, "index": self.indices[start:stop]}
            start = stop
        torch.set_rng_state(self.rng_after_epoch[epoch].clone())


class CachedEvalLoader:
    """Stand-in for an evaluation loader: batches of cached features in the loader's order.

    Yields dicts with "features" [B, E] and "label" [B]; ``len()`` is the number of batches.
    """

    def __init__(self, features, labels, batch_size, device):
        self.features = features.to(device)
        self.labels = labels
        self.batch_size = batch_size

    def __len__(self):
        return -(-self.labels.shape[0] // self.batch_size)

    def __iter__(self):
        for start in range(0, self.labels.shape[0], self.batch_size):
            stop = start + self.batch_size
            yield {"features": self.features[start:stop], "label": self.labels[start:stop]}


class FeatureCache:
    """Computes, stores and reads cached image features for one trainer (module docstring).

    Args:
        cfg: the run's config (reads FEATURE_CACHE.*, DATASET.NAME/ROOT, MODEL.BACKBONE.*, SEED).
        encode: images -> features [N, E] of the frozen image encoder.
        encoder_id: string naming how features are computed (part of the key).
        device: the trainer's device.
        autocast: the trainer's autocast context-manager factory.
        precision: name of the autocast dtype in effect (part of the key).
    """

    def __init__(self, cfg, encode, encoder_id, device, autocast, precision):
        self.cfg = cfg
        self.encoder = _ChunkedEncoder(encode, cfg.FEATURE_CACHE.BATCH_SIZE, device, autocast)
        self.device = device
        # Default: DATASET.ROOT/feature_cache, or the generated-files folder of a root that cannot be written.
        self.directory = osp.join(
            cfg.FEATURE_CACHE.DIR or osp.join(generated_files_dir(cfg, cfg.DATASET.ROOT), "feature_cache"),
            cfg.DATASET.NAME,
        )
        backbone = cfg.MODEL.BACKBONE
        self.common_key = {
            "version": FORMAT_VERSION,
            "dataset": cfg.DATASET.NAME,
            "backbone": [_file_identity(backbone.NAME), _file_identity(backbone.WEIGHTS)],
            "encoder": encoder_id,
            "precision": precision,
        }

    # ------------------------------------------------------------------------------- training
    def train_epochs(self, loader, first_epoch, max_epoch, current_epoch):
        """Cached stand-in for ``loader`` covering epochs ``first_epoch .. max_epoch - 1``.

        Args:
            loader: the real training DataLoader (iterated once per epoch on a miss).
            first_epoch, max_epoch: 0-based epoch range still to train.
            current_epoch: callable returning the trainer's epoch.
        """
        rng_start = torch.get_rng_state()
        key = dict(
            self.common_key,
            kind="train",
            split="train_x",
            items=_loader_items(loader),
            transform=repr(_dataset_wrapper(loader).transform),
            loader=[type(loader.sampler).__name__, loader.batch_size, loader.drop_last, loader.num_workers,
                    self.cfg.DATALOADER.K_TRANSFORMS],
            seed=self.cfg.SEED,
            epochs=[first_epoch, max_epoch],
            rng=hashlib.sha256(rng_start.numpy().tobytes()).hexdigest(),
        )
        persistent = self.cfg.SEED >= 0
        if not persistent:
            print("Feature cache: SEED < 0, so the training views are cached in memory only (no run could reuse them)")
        entry = self._read(key, "train") if persistent else None
        if entry is None:
            entry = self._compute_train(loader, first_epoch, max_epoch)
            if persistent:
                self._write(key, "train", entry)
        torch.set_rng_state(rng_start)
        return CachedTrainEpochs(entry, current_epoch, self.device)

    def _compute_train(self, loader, first_epoch, max_epoch):
        epochs = max_epoch - first_epoch
        print(
            f"Feature cache: encoding the training views of epochs {first_epoch + 1}..{max_epoch} "
            f"({len(loader.dataset)} images x {epochs} epochs, {self.encoder.batch_size} per encoder batch)"
        )
        labels, indices, batch_sizes, rng_after_epoch = [], [], [], []
        try:
            for _ in range(epochs):
                sizes = []
                for batch in loader:
                    self.encoder.add(batch["img"])
                    labels.append(batch["label"])
                    indices.append(batch["index"])
                    sizes.append(batch["label"].shape[0])
                self.encoder.flush()
                batch_sizes.append(sizes)
                rng_after_epoch.append(torch.get_rng_state())
        finally:  # the run trains on the cached epochs: the loader's kept workers are not needed again
            stop_loader_workers(loader)
        return {
            "first_epoch": first_epoch,
            "features": self.encoder.finish(),
            "labels": torch.cat(labels),
            "indices": torch.cat(indices),
            "batch_sizes": torch.tensor(batch_sizes, dtype=torch.long),
            "rng_after_epoch": torch.stack(rng_after_epoch),
        }

    # ----------------------------------------------------------------------------- evaluation
    def eval_loader(self, loader, split):
        """Cached stand-in for an evaluation ``loader`` (sequential sampler) of ``split``."""
        key = dict(
            self.common_key, kind="eval", split=split, items=_loader_items(loader),
            transform=repr(_dataset_wrapper(loader).transform),
        )
        entry = self._read(key, split)
        if entry is None:
            print(f"Feature cache: encoding the *{split}* images ({len(loader.dataset)})")
            labels = []
            for batch in loader:
                self.encoder.add(batch["img"])
                labels.append(batch["label"])
            entry = {"features": self.encoder.finish(), "labels": torch.cat(labels)}
            self._write(key, split, entry)
        return CachedEvalLoader(entry["features"], entry["labels"], loader.batch_size, self.device)

    # -------------------------------------------------------------------------------- storage
    def path(self, key, split):
        """File of the entry with these key fields."""
        return osp.join(self.directory, f"{split}-{_digest(key)[:24]}.pt")

    def _read(self, key, split):
        path = self.path(key, split)
        if not osp.isfile(path):
            return None
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a damaged or foreign file is recomputed, never trusted
            print(f'Feature cache: ignoring unreadable "{path}" ({type(error).__name__}: {error})')
            return None
        if stored.get("key") != json.loads(json.dumps(key)):
            print(f'Feature cache: "{path}" was written for other settings; recomputing')
            return None
        print(f'Feature cache: reading "{path}"')
        return stored["entry"]

    def _write(self, key, split, entry):
        path = self.path(key, split)
        with atomic_write(path, "wb") as f:
            torch.save({"key": key, "entry": entry}, f)
        print(f'Feature cache: saved "{path}"')
