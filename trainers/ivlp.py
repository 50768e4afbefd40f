"""IVLP: Independent Vision-Language Prompting (baseline of MaPLe, CVPR 2023, and PromptSRC).

Deep prompts in both towers, learned independently (no coupling):
text context T_1 [n_t, D_t] (the first n_t tokens of "a photo of a" when n_t <= 4, the
whole phrase staying in the template; otherwise N(0, 0.02)) and T_2..T_Jt [n_t, D_t];
vision prompts V_1..V_Jv [n_v, D_v] ~ N(0, 0.02). logits = 100 cos(image, text);
loss = cross-entropy; CLIP stays frozen.

PROMPT_DEPTH_VISION 0 turns vision prompting off: deep language prompting
(``IVLP/vit_b16_c2_ep5_batch4_4ctx_language_only``); depths 1/0 give CoOp's shallow text
prompts with the IVLP context convention.

The model (``IVLPCLIP``) and its config check are the independent-prompts family
(vlprompt/methods/independent_prompts.py), which PromptSRC and RAdaPrompt extend.
"""
from yacs.config import CfgNode as CN

from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case
from vlprompt.methods.independent_prompts import IVLPCLIP, check_vl_prompt_config


@register_cfg_extension
def add_ivlp_config(cfg):
    cfg.TRAINER.IVLP = CN()
    cfg.TRAINER.IVLP.N_CTX_VISION = 2  # vision prompt tokens per layer
    cfg.TRAINER.IVLP.N_CTX_TEXT = 2  # text prompt tokens per layer
    cfg.TRAINER.IVLP.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context
    cfg.TRAINER.IVLP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.IVLP.PROMPT_DEPTH_VISION = 9  # layers with vision prompts (0 = none)
    cfg.TRAINER.IVLP.PROMPT_DEPTH_TEXT = 9  # layers with text prompts (>= 1)


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
