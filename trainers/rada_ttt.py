"""RAda in the test-time training setting (paper §4.3; rada.md §6).

Episodic and unlabeled: for every test image independently,
1. build 64 views (the test view + 63 random resized crops / flips as INPUT.TRANSFORMS lists
   them, AugMix optional), seeded per image (vlprompt.data.test_time_views), and encode them
   with the frozen encoder;
2. compute RAda's logits for all views and keep the 10 % with the lowest entropy (6 views);
3. take 3 AdamW steps (lr 8e-4) on the mask generator, minimising the entropy of the kept
   views' average prediction;
4. predict the test view with the adapted generator;
then reset the generator to its starting weights. RAda starts from the zero-output generator
(M = 1, zero-shot CLIP); RAda-dagger starts from a trained one (``--model-dir`` of a RAda run,
e.g. on ImageNet). Results do not depend on the order of the test set.

Run with ``--eval-only``; DATALOADER.TEST.BATCH_SIZE images are adapted one after the other.
"""
import copy
import math

import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE, dataset_template
from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.data import build_data_loader
from vlprompt.data.test_time_views import EpisodeViews, ViewAugmenter, check_view_transforms
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer

from .rada import RAdaCLIP, add_generator_keys, check_rada_node


@register_cfg_extension
def add_rada_ttt_config(cfg):
    node = cfg.TRAINER.RADATTT = CN()
    node.PREC = "fp16"  # of the image encoder; adaptation runs in fp32
    node.TEMPLATE = DEFAULT_TEMPLATE  # class sentence; "" = the dataset's own template
    add_generator_keys(node)
    node.NUM_VIEWS = 64  # the test view + 63 augmented views
    node.SELECTION = 0.1  # fraction of views kept (lowest prediction entropy)
    node.STEPS = 3  # AdamW steps per image
    node.LR = 0.0008
    node.WEIGHT_DECAY = 0.01  # AdamW's default, as in TPT
    node.AUGMIX = False  # TPT/PromptAlign use plain crops for the ImageNet variants, AugMix elsewhere


def entropy_per_view(logits):
    """Prediction entropy [V] of logits [V, K]."""
    log_probs = logits.log_softmax(dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def average_prediction_entropy(logits):
    """Entropy of the mean of the views' probabilities, from logits [V, K] (a scalar)."""
    log_probs = logits.log_softmax(dim=-1)
    mean_log_probs = torch.logsumexp(log_probs, dim=0) - math.log(logits.shape[0])
    return -(mean_log_probs.exp() * mean_log_probs).sum()


@TRAINER_REGISTRY.register()
class RAdaTTT(ClipTrainer):
    """RAda test-time training; the mask generator is registered (loadable from a RAda run)."""

    learns = False  # nothing to train beforehand: evaluate with --eval-only

    def check_cfg(self, cfg):
        node = cfg.TRAINER.RADATTT
        check_rada_node(node, "TRAINER.RADATTT")
        check_view_transforms(cfg.INPUT.TRANSFORMS)
        if node.NUM_VIEWS < 1 or node.STEPS < 0 or node.LR <= 0 or node.WEIGHT_DECAY < 0:
            raise ConfigError(
                f"TRAINER.RADATTT: NUM_VIEWS must be >= 1 (got {node.NUM_VIEWS}), STEPS >= 0 (got {node.STEPS}), "
                f"LR > 0 (got {node.LR}) and WEIGHT_DECAY >= 0 (got {node.WEIGHT_DECAY})."
            )
        if not 0 < node.SELECTION <= 1 or int(node.NUM_VIEWS * node.SELECTION) < 1:
            raise ConfigError(
                f"TRAINER.RADATTT.SELECTION must be in (0, 1] and keep at least one of the {node.NUM_VIEWS} views, "
                f"got {node.SELECTION}."
            )

    def build_data_loader(self):
        super().build_data_loader()
        node, cfg = self.cfg.TRAINER.RADATTT, self.cfg
        wrapper = EpisodeViews.factory(ViewAugmenter(cfg, node.NUM_VIEWS, node.AUGMIX))
        self.test_loader = self.build_views_loader(self.dm.dataset.test, wrapper)
        if self.val_loader is not None:
            self.val_loader = self.build_views_loader(self.dm.dataset.val, wrapper)

    def build_views_loader(self, data_source, wrapper):
        """A sequential loader whose items are the views [V, 3, H, W] of one image."""
        cfg = self.cfg
        return build_data_loader(cfg, "SequentialSampler", data_source, batch_size=cfg.DATALOADER.TEST.BATCH_SIZE,
                                 is_train=False, dataset_wrapper=wrapper)

    def build_model(self):
        node = self.cfg.TRAINER.RADATTT
        clip, tokenizer = self.build_clip()
        templates = [dataset_template(self.dm.dataset, node.TEMPLATE)]
        self.model = RAdaCLIP(clip, tokenizer, self.classnames, templates, node).to(self.device).eval()
        self.register_model("mask_generator", self.model.mask_generator)
        self.episode_start = None

    def train(self):
        raise RuntimeError("RAdaTTT adapts at test time only: run it with --eval-only (--model-dir for RAda-dagger).")

    def test(self, split=None):
        """Evaluate with an episode per image, starting every episode from the current weights."""
        self.episode_start = copy.deepcopy(self.model.mask_generator.state_dict())
        return super().test(split)

    def model_inference(self, views):
        """Logits [B, K] of the test views after adapting on each image's views [B, V, 3, H, W]."""
        return torch.stack([self.adapt_and_predict(image_views) for image_views in views])

    def adapt_and_predict(self, views):
        """One episode: logits [K] for the test view (views[0]) after adapting on views [V, 3, H, W].

        Images are encoded under the trainer's autocast; adaptation and prediction run in fp32.
        The mask generator is reset to ``episode_start`` before and after.
        """
        node, model = self.cfg.TRAINER.RADATTT, self.model
        generator = model.mask_generator
        generator.load_state_dict(self.episode_start)
        with torch.no_grad():
            with self.autocast():
                features = F.normalize(model.encode_image_features(views).float(), dim=-1)
            class_features = model.class_text_features().float()
            entropy = entropy_per_view(model.rational(features, class_features, model.logit_scale)[0])
        kept = features[entropy.argsort()[: int(views.shape[0] * node.SELECTION)]]
        optimizer = torch.optim.AdamW(generator.parameters(), lr=node.LR, weight_decay=node.WEIGHT_DECAY)
        with torch.enable_grad():
            for _ in range(node.STEPS):
                loss = average_prediction_entropy(model.rational(kept, class_features, model.logit_scale)[0])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            logits = model.rational(features[:1], class_features, model.logit_scale)[0][0]
        generator.load_state_dict(self.episode_start)
        return logits
