"""FT: end-to-end fine-tuning of CLIP's image encoder with a zero-shot head (WiSE-FT's
"standard fine-tuning", Wortsman et al., CVPR 2022; FLYP's and RAda's Table 1 row "FT").

Model (mlfoundations/wise-ft @ 58b7a4b3, src/models/zeroshot.py and modeling.py): the text
tower is dropped after building the head. Head: a linear layer [K, E] + bias [K] whose weight
is exp(logit_scale) * normalise(mean_t normalise(text(t(c)))) over the templates t (CLIP's 80
ImageNet templates; the dataset's own template on the synthetic benchmark), bias 0; its input
is the L2-normalised image feature:

    logits [B, K] = exp(logit_scale) * f̂ W₀ᵀ at step 0 (zero-shot CLIP), then f̂ Wᵀ + b.

FT trains the image encoder and the head (weight and bias) with cross-entropy; recipe
(configs/trainers/FT/vit_b16.yaml, src/models/finetune.py): AdamW lr 3e-5, weight decay 0.1 on
every parameter, batch 512, 10 epochs, per-iteration cosine after 500 linear warm-up
iterations, gradient norm clipped to 1.0 (GRAD_CLIP) before each step, CLIP's training crop
RandomResizedCrop(scale 0.9-1), fp32. The other full fine-tuning rivals reuse this model: LP
(head only), LPFT, L2SP, WiSEFT. Runs as one process or under torchrun (DDP, the batch stays
global; vlprompt/engine/fine_tuning.py).

Compared with the official code (tools/official_wiseft.py, tests/test_fidelity.py):
wise-ft's own get_zeroshot_classifier, ClassificationHead, ImageClassifier and CE loss on a
random ViT-B/16 in its vendored clip, against this model on the same weights: head weights,
logits and the loss of one batch agree (fixture tests/fixtures/official/wiseft.json; relative max
differences in docs/fidelity.md).

The model (``FineTunedCLIP``) and its training (``ZeroShotHeadTrainer``) are the zero-shot-head
family (vlprompt/methods/zero_shot_head.py), which LP, LPFT, L2SP and WiSEFT build on.
"""
from yacs.config import CfgNode as CN

from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.zero_shot_head import ZeroShotHeadTrainer, add_ft_keys


@register_cfg_extension
def add_ft_config(cfg):
    node = cfg.TRAINER.FT = CN()
    add_ft_keys(node)


@TRAINER_REGISTRY.register()
class FT(ZeroShotHeadTrainer):
    """End-to-end fine-tuning; the checkpointed module (folder named after the trainer) holds
    the trained part: image encoder and head."""

    # The head from one template: the classifier's initialisation does not change the step's cost.
    benchmark_cases = (Case("FT/vit_b16.yaml", TRAIN, opts=("TRAINER.FT.TEMPLATE_ENSEMBLE", "False")),)

    node_name = "FT"
