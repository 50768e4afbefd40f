"""Episodic test-time trainers (TPT, RAda-TTT, PromptAlign): one adaptation episode per test image.

For every test image independently an episode

1. builds V views [V, 3, H, W] (view 0 = the ordinary test view, views 1..V-1 random crops /
   flips, AugMix optional), seeded per image (:mod:`vlprompt.data.test_time_views`);
2. scores all views and keeps the fraction SELECTION with the lowest prediction entropy
   (:func:`select_confident`, TPT's confidence selection);
3. takes STEPS optimizer steps (AdamW, LR, WEIGHT_DECAY, a fresh optimizer per image) on the
   method's parameters, minimising the entropy of the kept views' averaged probability
   (:func:`average_prediction_entropy`);
4. predicts view 0 with the adapted parameters;

and the parameters are reset to their starting values (those of ``--model-dir`` when given)
before the next image, so a prediction depends on its image only, never on the order or
the batching of the test set. A method implements steps 2-4 in ``adapt_and_predict``; this
module gives the rest to :class:`TestTimeTrainer`:

* the view loaders (``DATALOADER.TEST.BATCH_SIZE`` images per batch, adapted one after the other);
* ``test()``: the episodes over a split, resumable per image: after each image its label,
  logits [K] and their CRC-32 are appended to ``OUTPUT_DIR/test_time/SPLIT.bin`` (fixed-size
  records, flushed and fsynced; a record cut off by a kill is dropped on reading) under a header
  ``SPLIT.json`` (written atomically) that fingerprints what determines the episodes: the config
  but where things are and how they are batched (``NOT_FINGERPRINTED``), the values of the loaded
  parameters and the images (paths relative to DATASET.ROOT), so a moved or copied folder
  resumes. A run killed after n images and started again with the same command adapts images
  n+1.. only and ends with the same result as an uninterrupted one; a record that fails its
  checksum, has a label out of range or non-finite logits is adapted again with a line naming
  the image; a header that does not match (another config) is an error naming the folder;
* the throughput (images adapted per second in this process), printed and written as
  ``test_time`` into results.json.

The config node of a method (``TestTimeTrainer.episode_node``, e.g. "TPT" for TRAINER.TPT)
holds the episode keys of :func:`add_episode_keys`, checked by :func:`check_episode_node`.
"""
import hashlib
import json
import math
import os
import os.path as osp
import struct
import time
import zlib

import torch
from tqdm import tqdm

from vlprompt.config import ConfigError, dump_cfg
from vlprompt.data import build_data_loader
from vlprompt.data.test_time_views import EpisodeViews, ViewAugmenter, check_view_transforms
from vlprompt.fileio import atomic_write

from .clip_trainer import ClipTrainer
from .run_folder import RunFolder, RunFolderError

__all__ = [
    "TestTimeTrainer", "EpisodeLog", "add_episode_keys", "check_episode_node", "entropy_per_view",
    "average_prediction_entropy", "select_confident", "episode_optimizer",
]



def add_episode_keys(node, steps, lr, weight_decay=0.01):
    """Add the episode keys to a method's config node (defaults: TPT's views and selection)."""
    node.NUM_VIEWS = 64  # the test view + 63 augmented views
    node.SELECTION = 0.1  # fraction of views kept (lowest prediction entropy)
    node.STEPS = steps  # optimizer steps per image
    node.LR = lr  # AdamW, a fresh optimizer per image
    node.WEIGHT_DECAY = weight_decay  # AdamW's default 0.01, as TPT
    node.AUGMIX = False  # TPT: plain crops for the ImageNet variants, AugMix for the other sets
    node.VIEW_INTERPOLATION = ""  # resampling of the random crops; "" = INPUT.INTERPOLATION


def check_episode_node(node, path, transforms):
    """Raise ConfigError naming ``path`` (e.g. "TRAINER.TPT") for episode keys out of range."""
    check_view_transforms(transforms)
    if node.NUM_VIEWS < 1 or node.STEPS < 0 or node.LR <= 0 or node.WEIGHT_DECAY < 0:
        raise ConfigError(
            f"{path}: NUM_VIEWS must be >= 1 (got {node.NUM_VIEWS}), STEPS >= 0 (got {node.STEPS}), "
            f"LR > 0 (got {node.LR}) and WEIGHT_DECAY >= 0 (got {node.WEIGHT_DECAY})."
        )
    if not 0 < node.SELECTION <= 1 or int(node.NUM_VIEWS * node.SELECTION) < 1:
        raise ConfigError(
            f"{path}.SELECTION must be in (0, 1] and keep at least one of the {node.NUM_VIEWS} views, "
            f"got {node.SELECTION}."
        )
    if node.VIEW_INTERPOLATION not in ("", "bilinear", "bicubic", "nearest"):
        raise ConfigError(f'{path}.VIEW_INTERPOLATION must be "", "bilinear", "bicubic" or "nearest", '
                          f"got {node.VIEW_INTERPOLATION!r}.")


def entropy_per_view(logits):
    """Prediction entropy [V] of logits [V, K]."""
    log_probs = logits.log_softmax(dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def average_prediction_entropy(logits):
    """Entropy of the mean of the views' probabilities, from logits [V, K] (a scalar), via logsumexp."""
    log_probs = logits.log_softmax(dim=-1)
    mean_log_probs = torch.logsumexp(log_probs, dim=0) - math.log(logits.shape[0])
    mean_log_probs = mean_log_probs.clamp(min=torch.finfo(mean_log_probs.dtype).min)
    return -(mean_log_probs.exp() * mean_log_probs).sum()


def select_confident(logits, fraction):
    """Indices [int(V * fraction)] of the views with the lowest entropy, most confident first."""
    entropy = entropy_per_view(logits.detach())
    return entropy.argsort()[: int(logits.shape[0] * fraction)]


def episode_optimizer(params, node):
    """A fresh AdamW (node.LR, node.WEIGHT_DECAY) for one episode: no state carries over."""
    return torch.optim.AdamW(params, lr=node.LR, weight_decay=node.WEIGHT_DECAY)


# Config keys that do not change an episode: where the run writes, where the data lies (the
# images are fingerprinted by their paths relative to it), how images are batched and loaded.
NOT_FINGERPRINTED = ("OUTPUT_DIR", "RESUME", "DATASET.ROOT", "DATALOADER")

RECORD_FORMAT = "int64 label, float32 logits [K], uint32 CRC-32 of both (little-endian)"


class EpisodeLog:
    """The finished episodes of one split: ``test_time/SPLIT.json`` (header) + ``test_time/SPLIT.bin``.

    Record i holds image i of the test set (test-set order): its int64 label, its K float32 logits,
    then the CRC-32 of those bytes (:data:`RECORD_FORMAT`). A record whose checksum fails, whose
    label is outside 0..K-1 or whose logits are not finite is reported as bad by :meth:`read`, and
    the trainer computes its episode again and writes it in place (:meth:`replace`).

    Args:
        header_path, path: the split's header and records files in ``OUTPUT_DIR/test_time``
            (:meth:`RunFolder.episode_record_paths`).
        header: dict identifying the run (split, images, classes, fingerprint, record format).
    """

    def __init__(self, header_path, path, header):
        self.header_path, self.path = str(header_path), str(path)
        self.header = header
        self.record_size = 8 + 4 * header["num_classes"] + 4

    def read(self):
        """(labels [n], logits [n, K], bad) of the n records on disk; a torn last record is cut off.

        ``bad`` maps the index of each record that cannot be trusted to why (a failed checksum, a
        label out of range, non-finite logits); its row of ``labels``/``logits`` means nothing.
        """
        num_classes = self.header["num_classes"]
        empty = torch.zeros(0, dtype=torch.long), torch.zeros(0, num_classes), {}
        if not osp.isfile(self.header_path):
            return empty
        try:
            with open(self.header_path, "r", encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError) as error:
            raise RunFolderError(
                f"{self.header_path} is not readable JSON ({error}): the header of the test-time records cannot be "
                f"checked. Delete {osp.dirname(self.header_path)} to start this test-time run from the first image."
            ) from None
        if found != self.header:
            raise RunFolderError(
                f"{self.header_path} records the episodes of another run (other settings, starting weights or "
                f"images: {found}, expected {self.header}); rerun with --restart (train.py moves the folder's "
                f"files aside) or delete {osp.dirname(self.header_path)} to start this test-time run from the first image."
            )
        if not osp.isfile(self.path):
            return empty
        with open(self.path, "rb") as f:
            data = f.read()
        count = len(data) // self.record_size
        if count * self.record_size != len(data):
            print(f"Dropping an incomplete record at the end of {self.path} (an interrupted write)")
            with open(self.path, "r+b") as f:
                f.truncate(count * self.record_size)
        if not count:
            return empty
        labels, logits, bad = [], [], {}
        for i in range(count):
            record = data[i * self.record_size:(i + 1) * self.record_size]
            label = struct.unpack("<q", record[:8])[0]
            values = torch.frombuffer(bytearray(record[8:-4]), dtype=torch.float32)
            if zlib.crc32(record[:-4]) != struct.unpack("<I", record[-4:])[0]:
                bad[i] = "fails its checksum"
            elif not 0 <= label < num_classes:
                bad[i] = f"has label {label}, outside 0..{num_classes - 1}"
            elif not torch.isfinite(values).all():
                bad[i] = "holds non-finite logits"
            labels.append(label if i not in bad else 0)
            logits.append(values)
        return torch.tensor(labels), torch.stack(logits), bad

    def start(self):
        """Write the header (atomically) unless it is there."""
        if not osp.isfile(self.header_path):
            with atomic_write(self.header_path, "w") as f:
                json.dump(self.header, f, indent=1)

    def _record(self, label, logits):
        payload = struct.pack("<q", int(label)) + logits.detach().float().cpu().contiguous().numpy().tobytes()
        return payload + struct.pack("<I", zlib.crc32(payload))

    def append(self, label, logits):
        """Persist one finished episode after the last record: label (int), logits [K] (float32)."""
        with open(self.path, "ab") as f:
            f.write(self._record(label, logits))
            f.flush()
            os.fsync(f.fileno())

    def replace(self, index, label, logits):
        """Overwrite record ``index`` (a bad one) with a recomputed episode: label (int), logits [K]."""
        with open(self.path, "r+b") as f:
            f.seek(index * self.record_size)
            f.write(self._record(label, logits))
            f.flush()
            os.fsync(f.fileno())


class TestTimeTrainer(ClipTrainer):
    """Base of the episodic test-time trainers (see the module docstring).

    Subclasses set ``episode_node`` (the name of their TRAINER node), build ``self.model`` in
    ``build_model`` (registering the modules ``--model-dir`` loads) and implement
    ``start_episodes()`` (snapshot the starting parameters), ``adapt_and_predict(views)`` and
    ``episode_learnable()``.
    Run with ``--eval-only``.

    Attributes:
        throughput (dict or None): {"images", "seconds", "images_per_s"} of the last ``test()``
            in this process (resumed images excluded).
    """

    learns = False  # nothing to train beforehand: evaluate with --eval-only
    compile_refusal = ("it adapts at test time, one episode per image (views selected by their entropy, "
                       "optimizer steps per image), which TRAIN.COMPILE does not compile")
    episode_node = None

    @property
    def episode_cfg(self):
        return self.cfg.TRAINER[self.episode_node]

    def check_cfg(self, cfg):
        check_episode_node(cfg.TRAINER[self.episode_node], f"TRAINER.{self.episode_node}", cfg.INPUT.TRANSFORMS)

    def build_data_loader(self):
        super().build_data_loader()
        self.throughput = None
        if self.val_loader is not None:
            self.val_loader = self.build_views_loader(self.dm.dataset.val)
        self.test_loader = self.build_views_loader(self.dm.dataset.test)

    def view_augmenter(self):
        node = self.cfg.TRAINER[self.episode_node]
        return ViewAugmenter(self.cfg, node.NUM_VIEWS, node.AUGMIX, interpolation=node.VIEW_INTERPOLATION or None)

    def build_views_loader(self, data_source):
        """A sequential loader whose items are the views [V, 3, H, W] of one image."""
        cfg = self.cfg
        return build_data_loader(cfg, "SequentialSampler", data_source, batch_size=cfg.DATALOADER.TEST.BATCH_SIZE,
                                 is_train=False, dataset_wrapper=EpisodeViews.factory(self.view_augmenter()))

    def train(self):
        raise RuntimeError(f"{type(self).__name__} adapts at test time only: run it with --eval-only "
                           "(--model-dir DIR to start from a trained model).")

    def start_episodes(self):
        """Snapshot the parameters every episode starts from (called at the start of ``test()``)."""
        raise NotImplementedError

    def adapt_and_predict(self, views):
        """One episode: logits [K] of views[0] after adapting on views [V, 3, H, W]; resets after."""
        raise NotImplementedError

    def episode_learnable(self):
        """The number of values an episode tunes (the model's parameters stay frozen between episodes)."""
        raise NotImplementedError

    def model_inference(self, views):
        """Logits [B, K] of the test views of B images [B, V, 3, H, W], one episode each."""
        return torch.stack([self.adapt_and_predict(image_views) for image_views in views])

    def episode_log(self, split, data_source):
        """The EpisodeLog of ``split``. Its fingerprint covers what determines the episodes and
        nothing else: the config but the keys that only say where things are or how they are batched
        (:data:`NOT_FINGERPRINTED`), the values of the parameters the episodes start from (not the
        folder they were loaded from), and the images and labels (paths relative to DATASET.ROOT), so
        that a moved or copied run folder resumes."""
        cfg = self.cfg.clone()
        cfg.defrost()
        for key in NOT_FINGERPRINTED:
            *path, last = key.split(".")
            node = cfg
            for name in path:
                node = node[name]
            node.pop(last)
        digest = hashlib.sha256(dump_cfg(cfg).encode("utf-8"))
        for name in self.get_model_names():
            for key, value in sorted(self._models[name].state_dict().items()):
                digest.update(f"\n{name}.{key} {value.dtype} {tuple(value.shape)}\n".encode("utf-8"))
                digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        root = self.cfg.DATASET.ROOT
        for item in data_source:
            digest.update(f"\n{osp.relpath(item.impath, root) if root else item.impath} {item.label}".encode("utf-8"))
        header = {"split": split, "num_images": len(data_source), "num_classes": self.evaluated_classes(),
                  "fingerprint": digest.hexdigest(), "record": RECORD_FORMAT}
        return EpisodeLog(*RunFolder(self.output_dir).episode_record_paths(split), header)

    def evaluated_classes(self):
        """K, the number of classes the evaluator sees (after the dataset's prediction map)."""
        prediction_map = self.dm.dataset.prediction_map
        return self.num_classes if prediction_map is None else prediction_map.num_labels

    def test(self, split=None):
        """Episodes over ``split`` (default TEST.SPLIT), resuming after the last finished image.

        A loader whose dataset is not an EpisodeViews over a data source (e.g. the timed batches of
        tools/benchmark.py) is evaluated as it comes, without the episode log.
        """
        self.set_model_mode("eval")
        self.evaluator.reset()
        split, loader = self._eval_loader(self.cfg.TEST.SPLIT if split is None else split)
        self.check_images([split])
        print(f"Evaluate on the *{split}* set (test-time adaptation per image)")
        log, todo, records, done = None, [], 0, 0
        if isinstance(getattr(loader, "dataset", None), EpisodeViews):
            data_source = list(loader.dataset.data_source)
            log = self.episode_log(split, data_source)
            todo, records = self._resume_episodes(log, data_source)
            done = len(data_source) - len(todo)
            loader = self.build_views_loader([data_source[i] for i in todo]) if todo else []
        self.start_episodes()
        prediction_map = self.dm.dataset.prediction_map
        start, adapted = time.time(), 0
        with self.model.evaluation(), torch.no_grad():
            for batch in tqdm(loader):
                views, label = self.parse_batch_test(batch)
                for image_views, image_label in zip(views, label):
                    output = self.adapt_and_predict(image_views).unsqueeze(0)
                    if prediction_map is not None:
                        output = prediction_map.project(output)
                    output = output.float()
                    if log is not None:
                        index = todo[adapted]
                        if index < records:
                            log.replace(index, image_label, output[0])
                        else:
                            log.append(image_label, output[0])
                    self.evaluator.process(output, image_label.view(1))
                    adapted += 1
        seconds = time.time() - start
        self.throughput = {"images": adapted, "seconds": seconds,
                           "images_per_s": adapted / seconds if adapted and seconds > 0 else None}
        if adapted:
            print(f"Test-time adaptation: {adapted} images in {seconds:.1f} s ({adapted / seconds:.2f} images/s)")
        results = self.evaluator.evaluate()
        for key, value in results.items():
            self.write_scalar(f"{split}/{key}", value, self.epoch)
        self.last_test = {"split": split, "metrics": dict(results), "num_samples": done + adapted}
        return list(results.values())[0]

    def _resume_episodes(self, log, data_source):
        """Score the trusted records of ``log`` and start it; return (the indices of the images still
        to adapt: the bad records' first, then those after the last record; the number of records).
        A bad record is adapted again, with a line naming its image and why."""
        labels, logits, bad = log.read()
        records = labels.shape[0]
        for index, why in sorted(bad.items()):
            print(f"Adapting image {index} ({data_source[index].impath}) again: its record in {log.path} {why}")
        trusted = [i for i in range(records) if i not in bad]
        if trusted:
            print(f"Resuming: {len(trusted)} of {len(data_source)} images were adapted by an earlier run ({log.path})")
            self.evaluator.process(logits[trusted], labels[trusted])
        log.start()
        return sorted(bad) + list(range(records, len(data_source))), records

    def results_extra(self):
        return {"test_time": self.throughput}
