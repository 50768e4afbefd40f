"""RAda: Rational Adaptation, efficient fine-tuning setting (Chen et al., ICCV 2025).

Both CLIP encoders stay frozen; class features come from a hand-crafted sentence ("a photo
of a {}." by default). For every image the rational matrix R[c, d] = f_d t[c, d] is masked by
M = ReLU(1 + dM) from a mask generator (by default one multi-query attention layer over the
class axis, :mod:`vlprompt.methods.rada_rational`; others registered in
:mod:`vlprompt.methods.rada_mask_generators`, chosen by GENERATOR.NAME), and
logits = tau * sum_d M * R.
Only the mask generator learns; loss = CE + ALPHA * L_mask (||M - 1||_2 per image by
default). At step 0, M = 1 and RAda is zero-shot CLIP.

The image encoder is frozen, so the configs enable FEATURE_CACHE: views are encoded once and
training reads features. The model (``RAdaCLIP``), the generator's and the mask loss's keys,
``check_rada_node`` and ``build_rational_adapter`` are the rational-adapter family
(vlprompt/methods/rada.py), shared by the other RAda trainers (FFT, TTT, Prompt, Adapter): each
of their models holds a ``RationalAdapter`` (the generator registered as its ``mask_generator``
submodule).
"""
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import CACHED, TRAIN, Case
from vlprompt.methods.rada import RAdaCLIP, add_generator_keys, add_mask_loss_keys, check_rada_node


@register_cfg_extension
def add_rada_config(cfg):
    node = cfg.TRAINER.RADA = CN()
    node.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA; fp32 on CPU
    node.TEMPLATE = DEFAULT_TEMPLATE  # class sentence; "" = the dataset's own template
    add_generator_keys(node)
    add_mask_loss_keys(node)


@TRAINER_REGISTRY.register()
class RAda(ClipTrainer):
    """RAda (EFT); the checkpointed module is the mask generator."""

    benchmark_cases = (
        Case("RAda/vit_b16_base2new.yaml", CACHED, train_target=0.05, official_eval="1.05"),
        Case("RAda/vit_b16_base2new.yaml", TRAIN, name="RAda (images)", official_train=1.04, official_eval="1.05"),
    )

    frozen_image_encoder = True

    def check_cfg(self, cfg):
        check_rada_node(cfg.TRAINER.RADA, "TRAINER.RADA")

    def build_model(self):
        node = self.cfg.TRAINER.RADA
        clip, tokenizer = self.build_clip()
        templates = [self.dataset_template(node.TEMPLATE)]
        self.model = RAdaCLIP(clip, tokenizer, self.classnames, templates, node).to(self.device).eval()
        self.register_learner("mask_generator", self.model.mask_generator)
