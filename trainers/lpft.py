"""LP-FT (Kumar et al., ICLR 2022): linear probing, then fine-tuning of everything from the probed
head (FLYP's and RAda's Table 1 row "LP-FT"); no official code was read.

The model is FT's (vlprompt/methods/zero_shot_head.py). Two stages of one trainer, chained by tools/run_protocol.py
as the staged method LPFT:vit_b16_stage1@5:vit_b16_stage2 (stage 2 starts from stage 1's epoch-5
checkpoint through MODEL.INIT_WEIGHTS, as RAdaFFT):

* STAGE 1 (LP): the image encoder is frozen, the head trains (on cached features when
  FEATURE_CACHE is enabled);
* STAGE 2 (FT): image encoder and head train from stage 1's head, with a small learning rate.

Loss: cross-entropy in both stages. Recipe (RAda's, which it extends to RAda-FT; configs/trainers/
LPFT): AdamW, weight decay 0.1, batch 512, lr 4e-3 for 5 epochs, then 4e-6 for 5 epochs, cosine
after 500 warm-up iterations, gradient clipping 1.0.
"""
from yacs.config import CfgNode as CN

from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.zero_shot_head import ZeroShotHeadTrainer, add_ft_keys
from vlprompt.run_layout import epoch_checkpoint_name


@register_cfg_extension
def add_lpft_config(cfg):
    node = cfg.TRAINER.LPFT = CN()
    add_ft_keys(node)
    node.STAGE = 1  # 1: head only (LP); 2: image encoder and head (FT) from stage 1's checkpoint


@TRAINER_REGISTRY.register()
class LPFT(ZeroShotHeadTrainer):
    """LP-FT; the checkpointed module holds the head (stage 1), or image encoder and head (stage 2)."""

    benchmark_cases = (
        Case("LPFT/vit_b16_stage2.yaml", TRAIN, opts=("TRAINER.LPFT.TEMPLATE_ENSEMBLE", "False"),
             synthetic="LPFT/synthetic_stage2.yaml"),
    )

    node_name = "LPFT"

    @classmethod
    def trains_encoder(cls, cfg):
        return cfg.TRAINER.LPFT.STAGE == 2

    def check_cfg(self, cfg):
        node = cfg.TRAINER.LPFT
        if node.STAGE not in (1, 2):
            raise ConfigError(f"TRAINER.LPFT.STAGE must be 1 (linear probe) or 2 (fine-tune everything), got {node.STAGE}.")
        super().check_cfg(cfg)
        if node.STAGE == 2 and not cfg.MODEL.INIT_WEIGHTS:
            print("Note: LP-FT stage 2 without MODEL.INIT_WEIGHTS fine-tunes from the zero-shot head, not from a "
                  f"probed one (e.g. MODEL.INIT_WEIGHTS <stage 1 dir>/LPFT/{epoch_checkpoint_name(5)})")
