"""PromptSRC: Self-Regulating Prompts (Khattak et al., ICCV 2023).

IVLP's deep prompts (4+4 tokens, depth 9) regulated by the frozen CLIP:

* self-consistency losses, with frozen targets computed on the same augmented batch:
  L = CE(z, y) + 25 * L1(t, t~) + 10 * L1(f, f~) + KL(softmax(z~) || softmax(z)) / (B C),
  where t~ = mean of the unnormalised frozen fp32 text features over 60 ImageNet templates
  (normalised), f~ = normalised frozen image features, z~ = 100 f~ t~^T; the L1 terms are
  element means;
* Gaussian prompt aggregation (GPA): after every epoch e = 1..E (warm-up included) the
  learnable tensors are added to a running sum with weight N(e; GPA_MEAN, GPA_STD)
  (normalised to sum 1); training continues from the raw prompts, and after the last
  epoch the aggregate replaces them: it is what model.pth.tar-E holds and what is
  evaluated. The running sum is saved in every checkpoint, so a resumed run is exact.
"""
import numpy as np
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import fill_template, imagenet_templates
from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case
from vlprompt.methods.independent_prompts import IVLPCLIP, check_vl_prompt_config
from vlprompt.methods.prompt_aggregation import GaussianPromptAggregation


TEXT_TARGET_COUNT = 60
"""The reference's text targets use CLIP's 80 ImageNet templates without the last 20."""
SENTENCES_PER_PASS = 1024


@register_cfg_extension
def add_promptsrc_config(cfg):
    cfg.TRAINER.PROMPTSRC = CN()
    cfg.TRAINER.PROMPTSRC.N_CTX_VISION = 4  # vision prompt tokens per layer
    cfg.TRAINER.PROMPTSRC.N_CTX_TEXT = 4  # text prompt tokens per layer
    cfg.TRAINER.PROMPTSRC.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context
    cfg.TRAINER.PROMPTSRC.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.PROMPTSRC.PROMPT_DEPTH_VISION = 9  # layers with vision prompts (0 = none)
    cfg.TRAINER.PROMPTSRC.PROMPT_DEPTH_TEXT = 9  # layers with text prompts (>= 1)
    cfg.TRAINER.PROMPTSRC.TEXT_LOSS_WEIGHT = 25  # weight of L1(prompted, frozen text features)
    cfg.TRAINER.PROMPTSRC.IMAGE_LOSS_WEIGHT = 10  # weight of L1(prompted, frozen image features)
    cfg.TRAINER.PROMPTSRC.GPA_MEAN = 15  # mean epoch of the aggregation weights
    cfg.TRAINER.PROMPTSRC.GPA_STD = 1  # their standard deviation (in epochs)
    # Project keys (the reference has neither): weight of the KL logit term, and a switch
    # for GPA; the defaults are the reference's behaviour.
    cfg.TRAINER.PROMPTSRC.LOGITS_LOSS_WEIGHT = 1
    cfg.TRAINER.PROMPTSRC.GPA = True


class PromptSRCCLIP(IVLPCLIP):
    """IVLP's model plus the frozen-CLIP targets of the self-consistency losses.

    Args:
        clip, tokenizer, classnames: as IVLPCLIP. node: cfg.TRAINER.PROMPTSRC.
    """

    device_caches = IVLPCLIP.device_caches + ("_frozen_text",)  # frozen-CLIP text targets

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip, tokenizer, classnames, node)
        self.tokenizer = tokenizer
        self.weights = {"text": node.TEXT_LOSS_WEIGHT, "image": node.IMAGE_LOSS_WEIGHT, "logits": node.LOGITS_LOSS_WEIGHT}
        self._frozen_text = None

    def frozen_text_features(self):
        """t~: normalised mean over the 60 templates of frozen fp32 text features [C, E].

        Built on first use (training only) and kept for the class list; the T x C
        sentences are encoded ``SENTENCES_PER_PASS`` at a time.
        """
        if self._frozen_text is None:
            names, device = self.prompt_learner.classnames, self.clip.logit_scale.device
            templates = imagenet_templates()[:TEXT_TARGET_COUNT]
            sentences = [fill_template(template, name) for template in templates for name in names]
            ids = self.tokenizer(sentences).to(device)
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                features = torch.cat([self.encode_sentences(chunk) for chunk in ids.split(SENTENCES_PER_PASS)])
            mean = features.view(len(templates), len(names), -1).mean(dim=0)
            self._frozen_text = F.normalize(mean, dim=-1)
        return self._frozen_text

    def loss(self, images, labels):
        text_features = self.class_text_features()
        image_features = self.image_features(images)
        logits = self.cosine_logits(image_features, text_features)
        frozen_text = self.frozen_text_features()
        with torch.no_grad():
            frozen_image = F.normalize(self.clip.encode_image_plain(images), dim=-1)
            frozen_logits = self.cosine_logits(frozen_image, frozen_text)
        text_l1 = F.l1_loss(text_features, frozen_text.to(text_features.dtype))
        image_l1 = F.l1_loss(image_features, frozen_image.to(image_features.dtype))
        logits_kl = F.kl_div(
            F.log_softmax(logits, dim=1), F.log_softmax(frozen_logits, dim=1), reduction="sum", log_target=True,
        ) / logits.numel()
        total = (F.cross_entropy(logits, labels) + self.weights["text"] * text_l1
                 + self.weights["image"] * image_l1 + self.weights["logits"] * logits_kl)
        return total, logits, {}


def gpa_weights(max_epoch, mean, std):
    """GPA weights w_e of epochs e = 1..E: the Gaussian density N(e; mean, std), normalised
    to sum 1 (float64 array [E]); None when the density underflows to 0 at every epoch."""
    epochs = np.arange(1, max_epoch + 1, dtype=np.float64)
    density = np.exp(-0.5 * ((epochs - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
    total = density.sum()
    return density / total if total > 0 else None


@TRAINER_REGISTRY.register()
class PromptSRC(ClipTrainer):
    """PromptSRC trainer; the whole model is registered (as the reference) under "VLPromptLearner"."""

    benchmark_cases = (
        Case("PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml", TRAIN, train_target=4.0, official_train=8.0,
             official_eval=OFFICIAL_EVAL),
    )

    def check_cfg(self, cfg):
        check_vl_prompt_config(cfg, "PROMPTSRC")
        node = cfg.TRAINER.PROMPTSRC
        for key in ("TEXT_LOSS_WEIGHT", "IMAGE_LOSS_WEIGHT", "LOGITS_LOSS_WEIGHT"):
            check_range(f"TRAINER.PROMPTSRC.{key}", node[key], minimum=0)
        if node.GPA:
            check_range("TRAINER.PROMPTSRC.GPA_STD", node.GPA_STD, minimum=1e-6,
                        why="The aggregation weights are a Gaussian over epochs.")
            if gpa_weights(cfg.OPTIM.MAX_EPOCH, node.GPA_MEAN, node.GPA_STD) is None:
                raise ConfigError(
                    f"TRAINER.PROMPTSRC.GPA_MEAN {node.GPA_MEAN} and GPA_STD {node.GPA_STD} give no weight "
                    f"to any of the epochs 1..{cfg.OPTIM.MAX_EPOCH} (OPTIM.MAX_EPOCH): put the mean inside "
                    "that range or widen the Gaussian."
                )

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node = self.cfg.TRAINER.PROMPTSRC
        self.model = PromptSRCCLIP(clip, tokenizer, self.classnames, node).to(self.device)
        self.register_learner("VLPromptLearner", self.model)
        self.gpa = None
        if node.GPA:
            self.gpa = GaussianPromptAggregation(gpa_weights(self.max_epoch, node.GPA_MEAN, node.GPA_STD))

    def learnable_tensors(self):
        return {name: param for name, param in self.model.named_parameters() if param.requires_grad}

    def after_epoch(self):
        if self.gpa is not None:
            self.gpa.add(self.epoch, self.learnable_tensors())
            if self.epoch + 1 == self.max_epoch:
                self.use_aggregated_prompts()
        super().after_epoch()

    def use_aggregated_prompts(self):
        """Replace the learnable tensors by the GPA aggregate (before the final save and test)."""
        missing = sorted(set(range(self.max_epoch)) - set(self.gpa.epochs))
        if missing:
            print(f"Warning: GPA has no prompts of epochs {[e + 1 for e in missing]} (resumed from a checkpoint "
                  "without GPA state); aggregating the epochs it has")
        print("Using GPA model for final inference...")
        with torch.no_grad():
            for name, param in self.learnable_tensors().items():
                param.copy_(self.gpa.total[name])

    def get_trainer_state(self):
        state = super().get_trainer_state()
        if self.gpa is not None:
            state["gpa"] = self.gpa.state_dict()
        return state

    def set_trainer_state(self, state):
        super().set_trainer_state(state)
        if self.gpa is not None and "gpa" in state:
            self.gpa.load_state_dict(state["gpa"])

    def get_class_dependent_keys(self, name):
        # Reference checkpoints also hold the class-dependent embeddings.
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
