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
* ``test()``: the episodes over a split, resumable per image: after each image its label and
  logits [K] are appended to ``OUTPUT_DIR/test_time/SPLIT.bin`` (fixed-size records, flushed and
  fsynced; a record cut off by a kill is dropped on reading) under a header
  ``SPLIT.json`` (written atomically) that fingerprints the config (but DATALOADER), the loaded
  model and the images. A run
  killed after n images and started again with the same command adapts images n+1.. only and
  ends with the same result as an uninterrupted one; a header that does not match (another
  config) is an error naming the folder;
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

import torch
from tqdm import tqdm

from vlprompt.config import ConfigError
from vlprompt.data import build_data_loader
from vlprompt.data.test_time_views import EpisodeViews, ViewAugmenter, check_view_transforms
from vlprompt.fileio import atomic_write

from .clip_trainer import ClipTrainer
from .run_folder import RunFolder

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


class EpisodeLog:
    """The finished episodes of one split: ``FOLDER/SPLIT.json`` (header) + ``FOLDER/SPLIT.bin``.

    Each record is the int64 label then the K float32 logits of one image, in test-set order.

    Args:
        folder: ``OUTPUT_DIR/test_time``.
        split: "val" or "test".
        header: dict identifying the run (split, images, classes, fingerprint).
    """

    def __init__(self, folder, split, header):
        self.header_path = osp.join(folder, f"{split}.json")
        self.path = osp.join(folder, f"{split}.bin")
        self.header = header
        self.record_size = 8 + 4 * header["num_classes"]

    def read(self):
        """(labels [n], logits [n, K]) of the finished episodes; a torn last record is cut off."""
        num_classes = self.header["num_classes"]
        empty = torch.zeros(0, dtype=torch.long), torch.zeros(0, num_classes)
        if not osp.isfile(self.header_path):
            return empty
        with open(self.header_path, "r", encoding="utf-8") as f:
            found = json.load(f)
        if found != self.header:
            raise RuntimeError(
                f"{self.header_path} records the episodes of another run ({found}, expected {self.header}); "
                f"delete {osp.dirname(self.header_path)} to start this test-time run from the first image."
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
        labels, logits = [], []
        for i in range(count):
            record = data[i * self.record_size:(i + 1) * self.record_size]
            labels.append(struct.unpack("<q", record[:8])[0])
            logits.append(torch.frombuffer(bytearray(record[8:]), dtype=torch.float32))
        if not count:
            return empty
        return torch.tensor(labels), torch.stack(logits)

    def start(self):
        """Write the header (atomically) unless it is there."""
        if not osp.isfile(self.header_path):
            with atomic_write(self.header_path, "w") as f:
                json.dump(self.header, f, indent=1)

    def append(self, label, logits):
        """Persist one finished episode: label (int), logits [K] (float32)."""
        record = struct.pack("<q", int(label)) + logits.detach().float().cpu().contiguous().numpy().tobytes()
        with open(self.path, "ab") as f:
            f.write(record)
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
        """The EpisodeLog of ``split``; its fingerprint covers the config except DATALOADER (batching
        does not change a prediction), the loaded model and the images."""
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.pop("DATALOADER")
        fingerprint = hashlib.sha256("\n".join([
            cfg.dump(), str(self.run_info.get("model_dir", "")), str(self.run_info.get("load_epoch", "")),
            *[item.impath for item in data_source],
        ]).encode("utf-8")).hexdigest()
        header = {"split": split, "num_images": len(data_source), "num_classes": self.evaluated_classes(),
                  "fingerprint": fingerprint}
        return EpisodeLog(str(RunFolder(self.output_dir).test_time_dir), split, header)

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
        log, done = None, 0
        if isinstance(getattr(loader, "dataset", None), EpisodeViews):
            data_source = list(loader.dataset.data_source)
            log = self.episode_log(split, data_source)
            labels, logits = log.read()
            done = labels.shape[0]
            if done:
                print(f"Resuming: {done} of {len(data_source)} images were adapted by an earlier run ({log.path})")
                self.evaluator.process(logits, labels)
            log.start()
            loader = self.build_views_loader(data_source[done:]) if done < len(data_source) else []
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

    def results_extra(self):
        return {"test_time": self.throughput}
