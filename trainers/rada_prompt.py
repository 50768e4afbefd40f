"""RAda + Prompt (paper Table 2; rada.md §7): IVLP's deep vision and language prompts and RAda's
mask generator trained jointly on frozen encoders.

Image and class features come from the prompted towers of :mod:`trainers.ivlp` (4 + 4
context tokens, depth 9 by default); RAda masks their rational matrix; loss = CE + ALPHA *
L_mask. Prompts and mask generator share one optimizer (as the official PromptRAda). At step
0 the mask is all ones, so the model is IVLP at its initialisation.
"""
from yacs.config import CfgNode as CN

from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer

from .ivlp import IVLPCLIP, check_vl_prompt_config
from .rada import add_generator_keys, add_mask_loss_keys, build_rational_adapter, check_rada_node


@register_cfg_extension
def add_rada_prompt_config(cfg):
    node = cfg.TRAINER.RADAPROMPT = CN()
    node.N_CTX_VISION = 4  # vision prompt tokens per layer
    node.N_CTX_TEXT = 4  # text prompt tokens per layer
    node.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context
    node.PREC = "fp16"
    node.PROMPT_DEPTH_VISION = 9
    node.PROMPT_DEPTH_TEXT = 9
    add_generator_keys(node)
    add_mask_loss_keys(node)


class RAdaPromptCLIP(IVLPCLIP):
    """IVLP-prompted frozen CLIP with a mask generator on its rational matrix.

    Args:
        clip: CLIPRunner (frozen, ViT towers). tokenizer: Tokenizer. classnames: K names.
        node: cfg.TRAINER.RADAPROMPT.

    Attributes:
        rational: RationalAdapter (logits and loss). mask_generator: its generator.
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip, tokenizer, classnames, node)
        self.rational = build_rational_adapter(node, clip.text.output_dim)
        self.mask_generator = self.rational.generator

    def forward(self, images):
        return self.rational(self.image_features(images), self.class_text_features(), self.logit_scale)[0]

    def loss(self, images, labels):
        return self.rational.loss(self.image_features(images), self.class_text_features(), self.logit_scale, labels)


@TRAINER_REGISTRY.register()
class RAdaPrompt(ClipTrainer):
    """RAda + Prompt; the whole model's learned tensors (prompts and mask generator) are
    registered under IVLP's name "VLPromptLearner"."""

    def check_cfg(self, cfg):
        check_vl_prompt_config(cfg, "RADAPROMPT")
        check_rada_node(cfg.TRAINER.RADAPROMPT, "TRAINER.RADAPROMPT")

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = RAdaPromptCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.RADAPROMPT).to(self.device)
        self.register_learner("VLPromptLearner", self.model)

    def get_class_dependent_keys(self, name):
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
