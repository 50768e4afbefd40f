"""IVLP: Independent Vision-Language Prompting (baseline of MaPLe, CVPR 2023, and PromptSRC).

Deep prompts in both towers, learned independently (no coupling):
text context T_1 [n_t, D_t] (the first n_t tokens of "a photo of a" when n_t <= 4, the
whole phrase staying in the template; otherwise N(0, 0.02)) and T_2..T_Jt [n_t, D_t];
vision prompts V_1..V_Jv [n_v, D_v] ~ N(0, 0.02). logits = 100 cos(image, text);
loss = cross-entropy; CLIP stays frozen.

PROMPT_DEPTH_VISION 0 turns vision prompting off: deep language prompting
(``IVLP/vit_b16_c2_ep5_batch4_4ctx_language_only``); depths 1/0 give CoOp's shallow text
prompts with the IVLP context convention.
"""
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import (
    PromptedCLIP, TextContext, check_context_init, check_prompt_depth, prompt_parameters,
    read_reference_checkpoints, text_prompt_plan, tower_depths, vision_prompt_plan,
)
from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case


@register_cfg_extension
def add_ivlp_config(cfg):
    cfg.TRAINER.IVLP = CN()
    cfg.TRAINER.IVLP.N_CTX_VISION = 2  # vision prompt tokens per layer
    cfg.TRAINER.IVLP.N_CTX_TEXT = 2  # text prompt tokens per layer
    cfg.TRAINER.IVLP.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context
    cfg.TRAINER.IVLP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.IVLP.PROMPT_DEPTH_VISION = 9  # layers with vision prompts (0 = none)
    cfg.TRAINER.IVLP.PROMPT_DEPTH_TEXT = 9  # layers with text prompts (>= 1)


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
        plan = text_prompt_plan(self.text_prompts)
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


@TRAINER_REGISTRY.register()
class IVLP(ClipTrainer):
    """IVLP trainer; the whole model is registered (as the reference) under "VLPromptLearner"."""

    benchmark_cases = (
        Case("IVLP/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN, train_target=3.3, official_train=6.7,
             official_eval=OFFICIAL_EVAL),
    )

    def check_cfg(self, cfg):
        check_vl_prompt_config(cfg, "IVLP")

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = IVLPCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.IVLP).to(self.device)
        self.register_learner("VLPromptLearner", self.model)

    def get_class_dependent_keys(self, name):
        # Reference checkpoints also hold the class-dependent embeddings.
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
