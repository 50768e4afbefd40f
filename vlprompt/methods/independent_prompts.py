"""The independent deep prompts family: learned prompts in both towers, without coupling (IVLP).

``IVLPCLIP`` is frozen CLIP with a text context T_1 and deep text prompts T_2..T_Jt, and vision
prompts V_1..V_Jv, each learned on its own; ``check_vl_prompt_config`` checks a node of its
parameterisation (N_CTX_TEXT, N_CTX_VISION, CTX_INIT, PROMPT_DEPTH_TEXT, PROMPT_DEPTH_VISION).
Introduced by IVLP (MaPLe's baseline, ``trainers/ivlp.py``); PromptSRC and RAdaPrompt extend the
model, PromptKD's teacher is a PromptSRC run of it.
"""
import torch.nn.functional as F

from vlprompt.clip import (
    PromptedCLIP, TextContext, check_context_init, check_prompt_depth, prompt_parameters,
    read_reference_checkpoints, text_prompt_plan, tower_depths, vision_prompt_plan,
)
from vlprompt.config import ConfigError, check_range

__all__ = ["IVLPCLIP", "check_vl_prompt_config"]


class IVLPCLIP(PromptedCLIP):
    """Frozen CLIP with independent deep prompts in both towers.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        node: a config node with N_CTX_TEXT, N_CTX_VISION, CTX_INIT, PROMPT_DEPTH_TEXT,
            PROMPT_DEPTH_VISION (TRAINER.IVLP or TRAINER.PROMPTSRC).

    Attributes:
        prompt_learner: TextContext, ctx = T_1 [n_t, D_t].
        text_prompts: T_2..T_Jt, J_t - 1 Parameters [n_t, D_t].
        vision_prompts: V_1..V_Jv, J_v Parameters [n_v, D_v].
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.prompt_learner = TextContext(
            clip.text, tokenizer, classnames, n_ctx=node.N_CTX_TEXT, ctx_init=node.CTX_INIT, init_mode="ivlp",
        )
        self.text_prompts = prompt_parameters(node.PROMPT_DEPTH_TEXT - 1, node.N_CTX_TEXT, clip.text.width)
        vision_width = clip.visual.width if node.PROMPT_DEPTH_VISION else 0
        self.vision_prompts = prompt_parameters(node.PROMPT_DEPTH_VISION, node.N_CTX_VISION, vision_width)
        print(f'Initial text context: "{self.prompt_learner.phrase}" ({node.N_CTX_TEXT} learned tokens); '
              f"prompt depth text {node.PROMPT_DEPTH_TEXT}, vision {node.PROMPT_DEPTH_VISION} "
              f"({node.N_CTX_VISION} tokens)")
        read_reference_checkpoints(self)

    def compute_text_features(self):
        context = self.prompt_learner
        plan = text_prompt_plan(self.text_prompts, start=context.start)
        return self.clip.text(embeddings=context(), eot=context.eot, plan=plan).features

    def image_features(self, images):
        """Normalised prompted image features [B, E]."""
        return F.normalize(self.clip.encode_image(images, vision_prompt_plan(self.vision_prompts)), dim=-1)

    def forward(self, images):
        return self.cosine_logits(self.image_features(images), self.class_text_features())


def check_vl_prompt_config(cfg, node_name):
    """check_cfg of the IVLP parameterisation (IVLP, PromptSRC): depths, sizes, init phrase."""
    node, prefix = cfg.TRAINER[node_name], f"TRAINER.{node_name}"
    backbone = cfg.MODEL.BACKBONE.NAME
    vision_layers, text_layers = tower_depths(backbone)
    if node.PROMPT_DEPTH_TEXT < 1:
        raise ConfigError(
            f"{prefix}.PROMPT_DEPTH_TEXT must be at least 1 (the layer-1 text context is always "
            f"learned), got {node.PROMPT_DEPTH_TEXT}; for vision-only prompting use the VPT trainer."
        )
    check_prompt_depth(f"{prefix}.PROMPT_DEPTH_TEXT", node.PROMPT_DEPTH_TEXT, text_layers, 1, "text", backbone)
    check_prompt_depth(f"{prefix}.PROMPT_DEPTH_VISION", node.PROMPT_DEPTH_VISION, vision_layers, 0, "image", backbone)
    check_range(f"{prefix}.N_CTX_TEXT", node.N_CTX_TEXT, minimum=1)
    if node.PROMPT_DEPTH_VISION > 0:
        check_range(f"{prefix}.N_CTX_VISION", node.N_CTX_VISION, minimum=1,
                    why=f"{prefix}.PROMPT_DEPTH_VISION > 0 needs vision prompt tokens.")
    check_context_init(f"{prefix}.N_CTX_TEXT", node.N_CTX_TEXT, f"{prefix}.CTX_INIT", node.CTX_INIT, backbone)
