"""CoOp: Context Optimization (Zhou et al., IJCV 2022).

A shared (or class-specific) context of n learnable vectors replaces the words of the
prompt "X X ... X <class>." in front of (or around) the class name; CLIP stays frozen.
logits = 100 * cos(image feature, text feature of the prompt); loss = cross-entropy.

Compared by running KaiyangZhou/CoOp @ ff61507c (Dassl.pytorch @ c61a1b57), its CustomCLIP in
fp32, on a seeded random ViT-B/16 and a context at 10x its init std: logits and one batch's CE
agree (tools/official_equivalence.py, fixture tests/fixtures/official/coop.json,
tests/test_fidelity.py; the relative max differences are in docs/fidelity.md).
"""
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, TextContext
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case



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


@TRAINER_REGISTRY.register()
class CoOp(ClipTrainer):
    """CoOp trainer; the checkpointed module is the prompt learner (the context)."""

    benchmark_cases = (
        Case("CoOp/vit_b16_ep50_ctxv1.yaml", TRAIN, train_target=2.6, official_train=5.2,
             official_eval=OFFICIAL_EVAL),
    )

    exports_class_text_features = True

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = CoOpCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.COOP).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    def get_class_dependent_keys(self, name):
        # Reference CoOp checkpoints also hold the class-dependent embeddings.
        return ["token_prefix", "token_suffix"]
