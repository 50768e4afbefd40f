"""KgCoOp: Knowledge-guided Context Optimization (Yao et al., CVPR 2023).

CoOp plus a knowledge term that keeps the learned class text features W close to the
frozen CLIP features W_clip of a hand-crafted sentence per class:
L = CE(logits, y) + W * (1 - mean_c cos(W_c, W_clip,c)), W = 8.0 in every published run
(equal to 4.0 x the paper's mean squared distance of unit vectors). The frozen target
uses the zero-shot templates of the datasets, except DescribableTextures, for which the
reference uses "a photo of a {}, a type of texture.".

Config node TRAINER.KGCOOP (the reference keeps these keys under TRAINER.COOP, with
CTX_INIT True meaning "a photo of a"); its recipe passes N_CTX 4, CSC False, end and
W 8.0 on the command line, which our vit_b16_ep100_ctxv1.yaml holds.
"""
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import CLASS_TOKEN_POSITIONS, fill_template
from vlprompt.config import check_choice, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule
from vlprompt.methods.text_context import CoOpCLIP

# Where the knowledge target's sentence differs from the dataset's zero-shot template (other
# datasets: their own template).
KNOWLEDGE_TEMPLATES = {"DescribableTextures": "a photo of a {}, a type of texture."}
KNOWLEDGE_RULE = DatasetRule("KgCoOp's knowledge template", KNOWLEDGE_TEMPLATES, default="", option=False,
                             fallback="template", source="trainers.kgcoop.KNOWLEDGE_TEMPLATES")


@register_cfg_extension
def add_kgcoop_config(cfg):
    cfg.TRAINER.KGCOOP = CN()
    cfg.TRAINER.KGCOOP.N_CTX = 16  # number of context vectors (ignored when CTX_INIT is set)
    cfg.TRAINER.KGCOOP.CSC = False  # class-specific context
    cfg.TRAINER.KGCOOP.CTX_INIT = ""  # init phrase; the published runs use "a photo of a"
    cfg.TRAINER.KGCOOP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.KGCOOP.CLASS_TOKEN_POSITION = "end"  # end, middle or front
    cfg.TRAINER.KGCOOP.W = 1.0  # weight of the knowledge term (8.0 in the published runs)


class KgCoOpCLIP(CoOpCLIP):
    """CoOp's model plus the frozen knowledge target.

    Args:
        clip, tokenizer, classnames: as CoOpCLIP. node: cfg.TRAINER.KGCOOP.
        template: hand-crafted sentence template ("{}" = class name) of the target.

    Attributes:
        clip_text_features: buffer [C, E], normalised frozen CLIP features of the
            hand-crafted sentences (rebuilt with the class list, never saved).
    """

    def __init__(self, clip, tokenizer, classnames, node, template):
        super().__init__(clip, tokenizer, classnames, node)
        self.weight = node.W
        sentences = [fill_template(template, name) for name in classnames]
        print(f"Knowledge target prompts: {sentences}")
        device = clip.logit_scale.device
        with torch.no_grad():
            target = F.normalize(self.encode_sentences(tokenizer(sentences).to(device)), dim=-1)
        self.register_buffer("clip_text_features", target, persistent=False)

    def loss(self, images, labels):
        image_features = F.normalize(self.clip.encode_image(images), dim=-1)
        text_features = self.class_text_features()
        logits = self.cosine_logits(image_features, text_features)
        similarity = F.cosine_similarity(text_features, self.clip_text_features.to(text_features.dtype), dim=1, eps=1e-7)
        knowledge = 1.0 - similarity.mean()
        return F.cross_entropy(logits, labels) + self.weight * knowledge, logits, {}


@TRAINER_REGISTRY.register()
class KgCoOp(ClipTrainer):
    """KgCoOp trainer; the checkpointed module is the prompt learner (the context)."""

    benchmark_cases = (Case("KgCoOp/vit_b16_ep100_ctxv1.yaml", TRAIN),)

    exports_class_text_features = True

    def check_cfg(self, cfg):
        node = cfg.TRAINER.KGCOOP
        check_choice("TRAINER.KGCOOP.CLASS_TOKEN_POSITION", node.CLASS_TOKEN_POSITION, CLASS_TOKEN_POSITIONS)
        if not node.CTX_INIT:  # with an init phrase, n is its number of words
            check_range("TRAINER.KGCOOP.N_CTX", node.N_CTX, minimum=1)
        check_range("TRAINER.KGCOOP.W", node.W, minimum=0.0)

    def knowledge_template(self):
        return KNOWLEDGE_RULE.lookup(self.cfg.DATASET.NAME, own=self.dataset_template())

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node = self.cfg.TRAINER.KGCOOP
        self.model = KgCoOpCLIP(clip, tokenizer, self.classnames, node, self.knowledge_template()).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    def get_class_dependent_keys(self, name):
        # Reference KgCoOp checkpoints also hold the class-dependent embeddings.
        return ["token_prefix", "token_suffix"]
