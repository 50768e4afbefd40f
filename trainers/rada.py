"""RAda: Rational Adaptation, efficient fine-tuning setting (Chen et al., ICCV 2025).

Both CLIP encoders stay frozen; class features come from a hand-crafted sentence ("a photo
of a {}." by default). For every image the rational matrix R[c, d] = f_d t[c, d] is masked by
M = ReLU(1 + dM) from a mask generator (by default one multi-query attention layer over the
class axis, :mod:`trainers.rada_rational`; others registered in
:mod:`trainers.rada_mask_generators`, chosen by GENERATOR.NAME), and logits = tau * sum_d M * R.
Only the mask generator learns; loss = CE + ALPHA * L_mask (||M - 1||_2 per image by
default). At step 0, M = 1 and RAda is zero-shot CLIP.

The image encoder is frozen, so the configs enable FEATURE_CACHE: views are encoded once and
training reads features. The key helpers, ``check_rada_node`` and ``build_rational_adapter``
are shared by the other RAda trainers (FFT, TTT, Prompt, Adapter): each of their models holds
a :class:`RationalAdapter` (the generator registered as its ``mask_generator`` submodule).
"""
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE, check_template
from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import CACHED, TRAIN, Case
from vlprompt.families.template_head import TemplateCLIP

from .rada_mask_generators import build_mask_generator, check_generator_node
from .rada_rational import ATTN_NORMS, MASK_LOSSES, QUERY_INPUTS, RationalAdapter


def add_generator_keys(node):
    """Add the mask generator's keys (paper defaults) to a trainer node."""
    node.NUM_HEADS = 8
    node.ATTN_NORM = "row"  # "row" (paper) or "global" (official code: softmax over K x K / TEMP, x K)
    node.TEMP = 1.0  # attention temperature
    node.CHUNK_SIZE = 0  # images per attention chunk; 0 = auto (K = 1000 fits)
    node.GENERATOR = CN()
    node.GENERATOR.NAME = "RationalMaskGenerator"  # in trainers.rada_mask_generators.MASK_GENERATOR_REGISTRY
    node.GENERATOR.QUERIES = list(QUERY_INPUTS)  # attention queries: "image" (f), "text" (t_c), "rational" (R)
    node.GENERATOR.NUM_LAYERS = 1  # attention layers of StackedRationalMaskGenerator (supplement Table 10)


def add_mask_loss_keys(node):
    """Add the mask regulariser's keys (paper defaults) to a trainer node."""
    node.ALPHA = 1.5  # weight of the mask regulariser
    node.MASK_LOSS = "l2"  # "l2" (paper), "linf" (official), "l1", "mse"


@register_cfg_extension
def add_rada_config(cfg):
    node = cfg.TRAINER.RADA = CN()
    node.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA; fp32 on CPU
    node.TEMPLATE = DEFAULT_TEMPLATE  # class sentence; "" = the dataset's own template
    add_generator_keys(node)
    add_mask_loss_keys(node)


def check_rada_node(node, name):
    """Raise ConfigError for invalid RAda keys of ``node`` (called ``name`` in messages); checks
    the generator keys and, where the node has them, TEMPLATE and the mask-loss keys (PREC is the
    engine's: SimpleTrainer.check_declared_cfg)."""
    choices = (("ATTN_NORM", ATTN_NORMS), ("MASK_LOSS", MASK_LOSSES))
    for key, allowed in choices:
        if key in node and node[key] not in allowed:
            raise ConfigError(f"{name}.{key} must be one of {list(allowed)}, got '{node[key]}'.")
    if node.NUM_HEADS < 1 or node.CHUNK_SIZE < 0 or node.TEMP <= 0 or node.get("ALPHA", 0.0) < 0:
        raise ConfigError(
            f"{name}: NUM_HEADS must be >= 1 (got {node.NUM_HEADS}), CHUNK_SIZE >= 0 (got {node.CHUNK_SIZE}), "
            f"TEMP > 0 (got {node.TEMP}) and ALPHA >= 0 (got {node.get('ALPHA')})."
        )
    if "TEMPLATE" in node:
        check_template(node.TEMPLATE, f"{name}.TEMPLATE")
    check_generator_node(node, name)


def build_rational_adapter(node, dim):
    """RationalAdapter with ``node``'s mask generator for features of size ``dim``; ALPHA and
    MASK_LOSS are read when the node has them (RAdaTTT's has not: it only predicts)."""
    return RationalAdapter(build_mask_generator(node, dim), node.get("ALPHA"), node.get("MASK_LOSS"))


class RAdaCLIP(TemplateCLIP):
    """Frozen CLIP with a rational-matrix mask generator (EFT).

    Args:
        clip: CLIPRunner (frozen). tokenizer: Tokenizer. classnames: K names.
        templates: sentence templates (their normalised features are averaged).
        node: a trainer node with the generator keys (and the mask-loss keys to train).

    Attributes:
        rational: RationalAdapter (logits and loss). mask_generator: its generator.

    Build it in eval mode: trainers switch only the learned modules to training mode, and the
    frozen class features are then computed once per evaluation.
    """

    def __init__(self, clip, tokenizer, classnames, templates, node):
        super().__init__(clip, tokenizer, classnames, templates)
        self.rational = build_rational_adapter(node, clip.text.output_dim)
        self.mask_generator = self.rational.generator

    def forward_features(self, image_features):
        return self.rational(F.normalize(image_features, dim=-1), self.class_text_features(), self.logit_scale)[0]

    def loss_features(self, image_features, labels):
        """CE + ALPHA * L_mask from image features [B, E] (not normalised)."""
        return self.rational.loss(
            F.normalize(image_features, dim=-1), self.class_text_features(), self.logit_scale, labels
        )

    def loss(self, images, labels):
        return self.loss_features(self.encode_image_features(images), labels)


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
