"""RAda in the test-time training setting (paper §4.3).

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
The episode loop, the per-image resume and the images/s report are those of
vlprompt.engine.test_time.TestTimeTrainer.
"""
import copy

import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TEST_TIME, Case
from vlprompt.engine.test_time import (
    TestTimeTrainer, add_episode_keys, average_prediction_entropy, episode_optimizer, select_confident,
)
from vlprompt.methods.rada import RAdaCLIP, add_generator_keys, check_rada_node


@register_cfg_extension
def add_rada_ttt_config(cfg):
    node = cfg.TRAINER.RADATTT = CN()
    node.PREC = "fp16"  # of the image encoder; adaptation runs in fp32
    node.TEMPLATE = DEFAULT_TEMPLATE  # class sentence; "" = the dataset's own template
    add_generator_keys(node)
    add_episode_keys(node, steps=3, lr=0.0008)


@TRAINER_REGISTRY.register()
class RAdaTTT(TestTimeTrainer):
    """RAda test-time training; the mask generator is registered (loadable from a RAda run)."""

    benchmark_cases = (Case("RAdaTTT/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None),)

    episode_node = "RADATTT"

    def check_cfg(self, cfg):
        check_rada_node(cfg.TRAINER.RADATTT, "TRAINER.RADATTT")
        super().check_cfg(cfg)

    def build_model(self):
        node = self.cfg.TRAINER.RADATTT
        clip, tokenizer = self.build_clip()
        templates = [self.dataset_template(node.TEMPLATE)]
        self.model = RAdaCLIP(clip, tokenizer, self.classnames, templates, node).to(self.device).eval()
        self.register_model("mask_generator", self.model.mask_generator)
        self.episode_start = None

    def start_episodes(self):
        """Every episode starts from the current generator (zero-output, or a RAda run's)."""
        self.episode_start = copy.deepcopy(self.model.mask_generator.state_dict())

    def episode_learnable(self):
        return sum(parameter.numel() for parameter in self.model.mask_generator.parameters())

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
            logits = model.rational(features, class_features, model.logit_scale)[0]
        kept = features[select_confident(logits, node.SELECTION)]
        optimizer = episode_optimizer(generator.parameters(), node)
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
