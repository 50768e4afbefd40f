"""RAda + Prompt (paper Table 2): deep vision and language prompts and RAda's mask
generator trained jointly on frozen encoders.

Follows the official ``PromptRAda`` trainer (khufia/RAda, ``eft/trainers/prompt_rada.py``,
built on the PromptSRC code base): image and class features come from the prompted towers of
IVLP (:mod:`vlprompt.methods.independent_prompts`; 2 + 2 context tokens, depth 9 by default);
each class feature is then averaged with the frozen CLIP's template-ensemble feature of that class,

    t_c = normalise((1 - w) t_c^prompt + w t~_c),   w = FROZEN_TEXT_WEIGHT (official: 0.5),

where t_c^prompt is the prompted text feature and t~_c the mean over CLIP's 80 ImageNet
templates of the frozen, unprompted fp32 text features (both before normalisation). RAda masks
the rational matrix of the normalised image feature and t_c; loss = CE + ALPHA * L_mask (the
official trainer optimises the cross-entropy only: ALPHA 0 in its config; it computes
PromptSRC's self-consistency terms and drops them, so they are not implemented here).
Prompts and mask generator share one optimizer. At step 0 the mask is all ones, so the model
is IVLP at its initialisation with the class features above (exactly IVLP when w = 0).
"""
import torch
from yacs.config import CfgNode as CN

from vlprompt.clip import fill_template, imagenet_templates
from vlprompt.config import check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.independent_prompts import IVLPCLIP, check_vl_prompt_config
from vlprompt.methods.rada import add_generator_keys, add_mask_loss_keys, build_rational_adapter, check_rada_node


SENTENCES_PER_PASS = 1024


@register_cfg_extension
def add_rada_prompt_config(cfg):
    node = cfg.TRAINER.RADAPROMPT = CN()
    node.N_CTX_VISION = 2  # vision prompt tokens per layer (official PromptRAda config)
    node.N_CTX_TEXT = 2  # text prompt tokens per layer (official PromptRAda config)
    node.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context
    node.PREC = "fp16"
    node.PROMPT_DEPTH_VISION = 9
    node.PROMPT_DEPTH_TEXT = 9
    # Weight w of the frozen 80-template ensemble in the class features (module docstring);
    # 0.5 = the official PromptRAda's (t + t~) / 2, 0 = prompted features only (plain IVLP).
    node.FROZEN_TEXT_WEIGHT = 0.5
    add_generator_keys(node)
    add_mask_loss_keys(node)


class RAdaPromptCLIP(IVLPCLIP):
    """IVLP-prompted frozen CLIP, class features mixed with the frozen template ensemble, and a
    mask generator on their rational matrix.

    Args:
        clip: CLIPRunner (frozen, ViT towers). tokenizer: Tokenizer. classnames: K names.
        node: cfg.TRAINER.RADAPROMPT.

    Attributes:
        rational: RationalAdapter (logits and loss). mask_generator: its generator.
        frozen_text_weight: w of the module docstring.
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip, tokenizer, classnames, node)
        self.tokenizer = tokenizer
        self.frozen_text_weight = float(node.FROZEN_TEXT_WEIGHT)
        self.rational = build_rational_adapter(node, clip.text.output_dim)
        self.mask_generator = self.rational.generator
        self._frozen_text = None  # (class names, device, t~ [K, E])

    def frozen_text_features(self):
        """t~: mean over CLIP's 80 ImageNet templates of the frozen fp32 text features [K, E]
        (not normalised), computed once per class list and device."""
        names, device = tuple(self.prompt_learner.classnames), self.clip.logit_scale.device
        if self._frozen_text is None or self._frozen_text[:2] != (names, device):
            sentences = [fill_template(template, name) for template in imagenet_templates() for name in names]
            ids = self.tokenizer(sentences).to(device)
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                features = torch.cat([self.encode_sentences(chunk) for chunk in ids.split(SENTENCES_PER_PASS)])
            mean = features.float().view(len(imagenet_templates()), len(names), -1).mean(dim=0)
            self._frozen_text = (names, device, mean)
        return self._frozen_text[2]

    def compute_text_features(self):
        """(1 - w) t^prompt + w t~ [K, E] (fp32, not normalised); t^prompt alone when w = 0."""
        prompted = super().compute_text_features()
        if self.frozen_text_weight == 0:
            return prompted
        weight = self.frozen_text_weight
        return (1 - weight) * prompted.float() + weight * self.frozen_text_features()

    def forward(self, images):
        return self.rational(self.image_features(images), self.class_text_features(), self.logit_scale)[0]

    def loss(self, images, labels):
        return self.rational.loss(self.image_features(images), self.class_text_features(), self.logit_scale, labels)


@TRAINER_REGISTRY.register()
class RAdaPrompt(ClipTrainer):
    """RAda + Prompt; the whole model's learned tensors (prompts and mask generator) are
    registered under IVLP's name "VLPromptLearner"."""

    benchmark_cases = (Case("RAdaPrompt/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN),)

    def check_cfg(self, cfg):
        check_vl_prompt_config(cfg, "RADAPROMPT")
        check_rada_node(cfg.TRAINER.RADAPROMPT, "TRAINER.RADAPROMPT")
        check_range("TRAINER.RADAPROMPT.FROZEN_TEXT_WEIGHT", cfg.TRAINER.RADAPROMPT.FROZEN_TEXT_WEIGHT,
                    minimum=0.0, maximum=1.0, why="It is the weight of the frozen template ensemble in the class features.")

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = RAdaPromptCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.RADAPROMPT).to(self.device)
        self.register_learner("VLPromptLearner", self.model)

    def get_class_dependent_keys(self, name):
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
