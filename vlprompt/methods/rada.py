"""The rational-adapter family: RAda's mask generator over the rational matrix (RAda, ICCV 2025).

For every image the rational matrix R[c, d] = f_d t[c, d] is masked by M = ReLU(1 + dM) from a
mask generator (``rada_rational``; the ablations' generators in ``rada_mask_generators``), and
logits = tau * sum_d M * R. ``add_generator_keys`` / ``add_mask_loss_keys`` add a trainer node's
keys, ``check_rada_node`` checks them, ``build_rational_adapter`` builds the
:class:`RationalAdapter` of a node, and ``RAdaCLIP`` puts it on the template classifier of frozen
CLIP. Introduced by RAda (``trainers/rada.py``); RAdaFFT, RAdaTTT, RAdaPrompt and RAdaAdapter hold
a rational adapter too (the generator registered as their ``mask_generator`` submodule).
"""
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import check_template
from vlprompt.config import ConfigError
from vlprompt.methods.rada_mask_generators import build_mask_generator, check_generator_node
from vlprompt.methods.rada_rational import ATTN_NORMS, MASK_LOSSES, QUERY_INPUTS, RationalAdapter
from vlprompt.methods.template_head import TemplateCLIP

__all__ = ["add_generator_keys", "add_mask_loss_keys", "check_rada_node", "build_rational_adapter", "RAdaCLIP"]


def add_generator_keys(node):
    """Add the mask generator's keys (paper defaults) to a trainer node."""
    node.NUM_HEADS = 8
    node.ATTN_NORM = "row"  # "row" (paper) or "global" (official code: softmax over K x K / TEMP, x K)
    node.TEMP = 1.0  # attention temperature
    node.CHUNK_SIZE = 0  # images per attention chunk; 0 = auto (K = 1000 fits)
    node.GENERATOR = CN()
    node.GENERATOR.NAME = "RationalMaskGenerator"  # in vlprompt.methods.rada_mask_generators.MASK_GENERATOR_REGISTRY
    node.GENERATOR.QUERIES = list(QUERY_INPUTS)  # attention queries: "image" (f), "text" (t_c), "rational" (R)
    node.GENERATOR.NUM_LAYERS = 1  # attention layers of StackedRationalMaskGenerator (supplement Table 10)


def add_mask_loss_keys(node):
    """Add the mask regulariser's keys (paper defaults) to a trainer node."""
    node.ALPHA = 1.5  # weight of the mask regulariser
    node.MASK_LOSS = "l2"  # "l2" (paper), "linf" (official), "l1", "mse"


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
