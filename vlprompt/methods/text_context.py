"""The text-context family: CoOp's learnable context in front of the class name (CoOp, IJCV 2022).

``CoOpCLIP`` is frozen CLIP with a ``TextContext`` of n learnable vectors (shared or class-specific)
in the prompt "X X ... X <class>."; its node ``TRAINER.COOP`` holds the context's size, init
phrase, class-token position and precision. Introduced by CoOp (``trainers/coop.py``); KgCoOp
and ProGrad extend the model, ATPrompt and DePT build on it (TRAINER.ATPROMPT.BASE /
TRAINER.DEPT.BASE "CoOp"), and TPT tunes its context at test time (TRAINER.TPT.PROMPT "coop").
"""
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, TextContext
from vlprompt.config import register_cfg_extension

__all__ = ["add_coop_config", "CoOpCLIP"]


@register_cfg_extension
def add_coop_config(cfg):
    cfg.TRAINER.COOP = CN()
    cfg.TRAINER.COOP.N_CTX = 16  # number of context vectors
    cfg.TRAINER.COOP.CSC = False  # class-specific context
    cfg.TRAINER.COOP.CTX_INIT = ""  # init phrase, e.g. "a photo of a"
    cfg.TRAINER.COOP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.COOP.CLASS_TOKEN_POSITION = "end"  # end, middle or front


class CoOpCLIP(PromptedCLIP):
    """Frozen CLIP with CoOp's learnable text context.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        node: cfg.TRAINER.COOP.
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.prompt_learner = TextContext(
            clip.text, tokenizer, classnames, n_ctx=node.N_CTX, ctx_init=node.CTX_INIT,
            class_specific=node.CSC, class_token_position=node.CLASS_TOKEN_POSITION,
        )

    def compute_text_features(self):
        prompts = self.prompt_learner
        return self.clip.text(embeddings=prompts(), eot=prompts.eot).features

    def unnormalised_image_features(self, images):
        """Image features [B, E] before L2 normalisation (CoOp does not prompt the image tower)."""
        return self.clip.encode_image(images)

    def forward(self, images):
        image_features = F.normalize(self.unnormalised_image_features(images), dim=-1)
        return self.cosine_logits(image_features, self.class_text_features())
