"""The coupled-prompts family: MaPLe's text prompts and the vision prompts derived from them (MaPLe, CVPR 2023).

``MaPLeCLIP`` is frozen CLIP with text prompts T_1..T_J and vision prompts V_k = F_k(T_k) (linear
couplings) in the first J blocks of both towers; its node ``TRAINER.MAPLE`` holds the prompt
length, depth, init phrase and precision, checked by ``check_maple_cfg``. Introduced by MaPLe
(``trainers/maple.py``); ATPrompt and DePT build on it (their BASE "MaPLe"), TPT tunes it at test
time (TRAINER.TPT.PROMPT "maple") and PromptAlign aligns its token statistics.
"""
import copy

import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import (
    PromptedCLIP, TextContext, check_context_init, check_prompt_sizes, prompt_parameters,
    read_reference_checkpoints, text_prompt_plan, vision_prompt_plan,
)
from vlprompt.config import register_cfg_extension

__all__ = ["add_maple_config", "check_maple_cfg", "MultiModalPromptLearner", "MaPLeCLIP"]


@register_cfg_extension
def add_maple_config(cfg):
    cfg.TRAINER.MAPLE = CN()
    cfg.TRAINER.MAPLE.N_CTX = 2  # prompt tokens per layer (both towers)
    cfg.TRAINER.MAPLE.CTX_INIT = "a photo of a"  # init phrase of T_1
    cfg.TRAINER.MAPLE.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.MAPLE.PROMPT_DEPTH = 9  # layers with prompts in both towers (1 = shallow MaPLe)


class MultiModalPromptLearner(TextContext):
    """MaPLe's learnable part: the text context T_1, deep text prompts and the couplings.

    Args:
        text_tower, tokenizer, classnames, n_ctx, ctx_init: as TextContext ("ivlp" mode).
        depth: J, number of prompted layers.
        vision_width: D_v of the image tower.

    Attributes (names as in the reference, so its checkpoints load):
        ctx: T_1 [n, D_t].
        proj: F_1, Linear(D_t, D_v).
        compound_prompts_text: T_2..T_J, J-1 Parameters [n, D_t].
        compound_prompt_projections: F_2..F_J, J-1 Linear(D_t, D_v).
    """

    def __init__(self, text_tower, tokenizer, classnames, n_ctx, ctx_init, depth, vision_width):
        super().__init__(text_tower, tokenizer, classnames, n_ctx=n_ctx, ctx_init=ctx_init, init_mode="ivlp")
        width = text_tower.width
        self.proj = nn.Linear(width, vision_width)
        self.compound_prompts_text = prompt_parameters(depth - 1, n_ctx, width)
        coupling = nn.Linear(width, vision_width)
        self.compound_prompt_projections = nn.ModuleList(copy.deepcopy(coupling) for _ in range(depth - 1))

    def vision_prompts(self):
        """V_1..V_J = F_k(T_k): J tensors [n, D_v]."""
        deep = zip(self.compound_prompt_projections, self.compound_prompts_text)
        return [self.proj(self.ctx)] + [coupling(prompts) for coupling, prompts in deep]


class MaPLeCLIP(PromptedCLIP):
    """Frozen CLIP with MaPLe's coupled prompts.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        node: cfg.TRAINER.MAPLE.
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.prompt_learner = MultiModalPromptLearner(
            clip.text, tokenizer, classnames, n_ctx=node.N_CTX, ctx_init=node.CTX_INIT,
            depth=node.PROMPT_DEPTH, vision_width=clip.visual.width,
        )
        print(f'MaPLe: initial context "{self.prompt_learner.phrase}" ({node.N_CTX} learned tokens), '
              f"prompt depth {node.PROMPT_DEPTH}")
        read_reference_checkpoints(self)

    def compute_text_features(self):
        prompts = self.prompt_learner
        plan = text_prompt_plan(prompts.compound_prompts_text, start=prompts.start)
        return self.clip.text(embeddings=prompts(), eot=prompts.eot, plan=plan).features

    def unnormalised_image_features(self, images):
        """Image features [B, E] with the coupled vision prompts, before L2 normalisation."""
        plan = vision_prompt_plan(self.prompt_learner.vision_prompts())
        return self.clip.encode_image(images, plan)

    def image_features(self, images):
        """Normalised image features [B, E] with the coupled vision prompts."""
        return F.normalize(self.unnormalised_image_features(images), dim=-1)

    def forward(self, images):
        return self.cosine_logits(self.image_features(images), self.class_text_features())


def check_maple_cfg(cfg):
    """Raise ConfigError unless TRAINER.MAPLE fits the backbone: prompt depth and length in both
    towers, and an init phrase of at most N_CTX tokens."""
    node = cfg.TRAINER.MAPLE
    check_prompt_sizes(cfg, "MAPLE", text=("PROMPT_DEPTH", "N_CTX"), vision=("PROMPT_DEPTH", "N_CTX"))
    check_context_init("TRAINER.MAPLE.N_CTX", node.N_CTX, "TRAINER.MAPLE.CTX_INIT", node.CTX_INIT,
                       cfg.MODEL.BACKBONE.NAME)
