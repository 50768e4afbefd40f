"""VPT: deep vision prompting (Jia et al., ECCV 2022) on CLIP, as in the MaPLe repository.

Only the image tower is prompted: V_1..V_J [n_v, D_v] ~ N(0, 0.02) (V_1 appended before
``ln_pre``, V_k replacing the prompt outputs at the input of layer k). The classifier is
the frozen CLIP text feature of the hand-crafted sentence "a photo of a <class>."
(``CTX_INIT`` + class name). logits = 100 cos(image, text); loss = cross-entropy.
"""
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import (
    PromptedCLIP, check_prompt_sizes, prompt_parameters, read_reference_checkpoints, vision_prompt_plan,
)
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case


@register_cfg_extension
def add_vpt_config(cfg):
    cfg.TRAINER.VPT = CN()
    cfg.TRAINER.VPT.N_CTX_VISION = 2  # vision prompt tokens per layer
    cfg.TRAINER.VPT.CTX_INIT = "a photo of a"  # phrase of the fixed hand-crafted classifier
    cfg.TRAINER.VPT.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.VPT.PROMPT_DEPTH_VISION = 1  # layers with vision prompts (>= 1)


class VPTCLIP(PromptedCLIP):
    """Frozen CLIP with deep vision prompts and a fixed hand-crafted text classifier.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        node: cfg.TRAINER.VPT.

    Attributes:
        vision_prompts: V_1..V_J, J Parameters [n_v, D_v].
        class_features: buffer [C, E], frozen text features of "<CTX_INIT> <class>."
            (rebuilt with the class list, never saved).
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.vision_prompts = prompt_parameters(node.PROMPT_DEPTH_VISION, node.N_CTX_VISION, clip.visual.width)
        sentences = [f"{node.CTX_INIT} {name.replace('_', ' ')}.".strip() for name in classnames]
        print(f"VPT: fixed prompts {sentences}; prompt depth {node.PROMPT_DEPTH_VISION} "
              f"({node.N_CTX_VISION} tokens)")
        with torch.no_grad():
            features = self.encode_sentences(tokenizer(sentences).to(clip.logit_scale.device))
        self.register_buffer("class_features", features, persistent=False)
        read_reference_checkpoints(self)

    def compute_text_features(self):
        return self.class_features

    def forward(self, images):
        plan = vision_prompt_plan(self.vision_prompts)
        image_features = F.normalize(self.clip.encode_image(images, plan), dim=-1)
        return self.cosine_logits(image_features, self.class_text_features())


@TRAINER_REGISTRY.register()
class VPT(ClipTrainer):
    """VPT trainer; the whole model is registered (as the reference) under "prompt_learner"."""

    benchmark_cases = (Case("VPT/vit_b16_c2_ep5_batch4_4.yaml", TRAIN),)

    def check_cfg(self, cfg):
        check_prompt_sizes(cfg, "VPT", vision=("PROMPT_DEPTH_VISION", "N_CTX_VISION"))

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = VPTCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.VPT).to(self.device)
        self.register_learner("prompt_learner", self.model)
