"""LP: linear probing of CLIP with the zero-shot head (WiSE-FT's "--freeze-encoder" fine-tuning;
FLYP's and RAda's Table 1 row "LP").

The model is FT's (vlprompt/methods/zero_shot_head.py: head W₀ = exp(logit_scale) * zero-shot
weights, bias 0, on normalised image features); the image encoder stays frozen and only the head (weight and bias)
trains, with cross-entropy. As upstream (mlfoundations/wise-ft @ 58b7a4b3, src/models/finetune.py
with --freeze-encoder, src/datasets/common.py get_features), the head trains on image features
computed once: the configs enable FEATURE_CACHE, and the training images take the evaluation
transform, upstream's ``val_preprocess`` (CLIP's preprocess: the shorter side resized to 224, bicubic,
the 224 x 224 center crop, CLIP's normalisation), not INPUT.TRANSFORMS' training resize. Recipe (configs/trainers/LP/vit_b16.yaml): the official fine-tuning loop (AdamW,
weight decay 0.1, batch 512, 10 epochs, cosine after 500 warm-up iterations, gradient clipping
1.0); its learning rate is not given upstream (the repository's default is 1e-3): the config uses
RAda's LP-stage 4e-3 (LPFT stage 1). Single process (the features make one process fast).
"""
from yacs.config import CfgNode as CN

from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import CACHED, Case
from vlprompt.methods.zero_shot_head import ZeroShotHeadTrainer, add_ft_keys


@register_cfg_extension
def add_lp_config(cfg):
    node = cfg.TRAINER.LP = CN()
    add_ft_keys(node)


@TRAINER_REGISTRY.register()
class LP(ZeroShotHeadTrainer):
    """Linear probe; the checkpointed module holds the head."""

    # On cached features; the head from one template (as FT's case).
    benchmark_cases = (Case("LP/vit_b16.yaml", CACHED, opts=("TRAINER.LP.TEMPLATE_ENSEMBLE", "False")),)

    node_name = "LP"
    supports_distributed = False

    @classmethod
    def trains_encoder(cls, cfg):
        return False

    def training_transform(self):
        """The evaluation view, as upstream's features (CLIP's own preprocess): the shorter side
        resized to max(INPUT.SIZE), the center crop INPUT.SIZE, INPUT.PIXEL_MEAN/STD normalisation;
        an image becomes [3, H, W]."""
        from vlprompt.data.transforms import build_transform  # torchvision, when a run builds its data

        return build_transform(self.cfg, is_train=False)
