"""L2-SP (Li et al., ICML 2018): fine-tuning with a penalty towards the pretrained weights instead
of weight decay (FLYP's and RAda's Table 1 row "L2-SP"); no official code was read.

The model is FT's (vlprompt/methods/zero_shot_head.py), trained end to end like FT; the loss adds

    Ω(w) = ALPHA / 2 * ||w_S - w_S⁰||² + BETA / 2 * ||w_head||²,

w_S the image encoder's parameters, w_S⁰ their pretrained values (the CLIP weights the run
starts from, before any MODEL.INIT_WEIGHTS), w_head the head's weight and bias. The penalty
replaces weight decay: OPTIM.WEIGHT_DECAY must be 0. Recipe (configs/trainers/L2SP/vit_b16.yaml):
FT's (AdamW lr 3e-5, batch 512, 10 epochs, cosine after 500 warm-up iterations, gradient clipping
1.0) with weight decay 0 and ALPHA 0.1, BETA 0.01 (FLYP gives no values; these are the L2-SP
authors' own, from their implementation holyseven/TransferLearningClassification: train.sh's
--weight_decay_rate 0.1 --weight_decay_rate2 0.01 on tf.nn.l2_loss = sum(x²) / 2; the config
header cites them).
"""
from yacs.config import CfgNode as CN

from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.zero_shot_head import ZeroShotHeadTrainer, add_ft_keys


@register_cfg_extension
def add_l2sp_config(cfg):
    node = cfg.TRAINER.L2SP = CN()
    add_ft_keys(node)
    node.ALPHA = 0.1  # weight of ||w_S - w_S⁰||² / 2 (image encoder towards its pretrained values)
    node.BETA = 0.01  # weight of ||w_head||² / 2 (the head)


def l2sp_penalty(encoder_params, anchors, head_params, alpha, beta):
    """ALPHA / 2 * sum ||w - w⁰||² over ``encoder_params`` (anchors: their w⁰, same order) +
    BETA / 2 * sum ||w||² over ``head_params`` (a 0-dim tensor)."""
    to_start = sum(((param - anchor) ** 2).sum() for param, anchor in zip(encoder_params, anchors))
    head = sum((param ** 2).sum() for param in head_params)
    return alpha / 2 * to_start + beta / 2 * head


@TRAINER_REGISTRY.register()
class L2SP(ZeroShotHeadTrainer):
    """FT with the L2-SP penalty (term "l2sp" in the logged summary)."""

    benchmark_cases = (Case("L2SP/vit_b16.yaml", TRAIN, opts=("TRAINER.L2SP.TEMPLATE_ENSEMBLE", "False")),)

    node_name = "L2SP"

    def check_cfg(self, cfg):
        super().check_cfg(cfg)
        node = cfg.TRAINER.L2SP
        if node.ALPHA < 0 or node.BETA < 0:
            raise ConfigError(f"TRAINER.L2SP.ALPHA and BETA must be >= 0, got {node.ALPHA} and {node.BETA}.")
        if cfg.OPTIM.WEIGHT_DECAY != 0:
            raise ConfigError(
                f"OPTIM.WEIGHT_DECAY is {cfg.OPTIM.WEIGHT_DECAY}, but L2-SP's penalty replaces weight decay "
                "(TRAINER.L2SP.ALPHA towards the pretrained weights, BETA on the head): set OPTIM.WEIGHT_DECAY 0."
            )

    def record_pretrained(self, model):
        self.anchors = [param.detach().to(self.device, copy=True) for param in model.image_encoder.parameters()]

    def objective(self, logits, labels):
        loss, terms = super().objective(logits, labels)
        node = self.node
        penalty = l2sp_penalty(list(self.model.image_encoder.parameters()), self.anchors,
                               list(self.model.head.parameters()), node.ALPHA, node.BETA)
        return loss + penalty, dict(terms, l2sp=penalty.detach())
