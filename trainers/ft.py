"""FT: end-to-end fine-tuning of CLIP's image encoder with a zero-shot head (WiSE-FT's
"standard fine-tuning", Wortsman et al., CVPR 2022; FLYP's and RAda's Table 1 row "FT").

Model (mlfoundations/wise-ft @ 58b7a4b3, src/models/zeroshot.py and modeling.py): the text
tower is dropped after building the head. Head: a linear layer [K, E] + bias [K] whose weight
is exp(logit_scale) * normalise(mean_t normalise(text(t(c)))) over the templates t (CLIP's 80
ImageNet templates; the dataset's own template on the synthetic benchmark), bias 0; its input
is the L2-normalised image feature:

    logits [B, K] = exp(logit_scale) * f̂ W₀ᵀ at step 0 (zero-shot CLIP), then f̂ Wᵀ + b.

FT trains the image encoder and the head (weight and bias) with cross-entropy; recipe
(configs/trainers/FT/vit_b16.yaml, src/models/finetune.py): AdamW lr 3e-5, weight decay 0.1 on
every parameter, batch 512, 10 epochs, per-iteration cosine after 500 linear warm-up
iterations, gradient norm clipped to 1.0 (GRAD_CLIP) before each step, CLIP's training crop
RandomResizedCrop(scale 0.9-1), fp32. The other full fine-tuning rivals reuse this model: LP
(head only), LPFT, L2SP, WiSEFT. Runs as one process or under torchrun (DDP, the batch stays
global; vlprompt/engine/fine_tuning.py).

Compared with the official code (tools/official_wiseft.py, tests/test_fidelity.py):
wise-ft's own get_zeroshot_classifier, ClassificationHead, ImageClassifier and CE loss on a
random ViT-B/16 in its vendored clip, against this model on the same weights: head weights,
logits and the loss of one batch agree (fixture tests/fixtures/official/wiseft.json; relative max
differences in docs/fidelity.md).
"""
import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP
from vlprompt.config import check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.fine_tuning import FullFineTuningTrainer, add_fine_tuning_keys
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_optimizer
from vlprompt.utils import count_num_param, load_pretrained_weights


def add_ft_keys(node):
    """The keys every trainer built on FT has: PREC, the head's templates, the schedule, GRAD_CLIP."""
    node.PREC = "fp32"  # wise-ft's clip.load makes every weight fp32
    add_fine_tuning_keys(node)  # TEMPLATE, TEMPLATE_ENSEMBLE, LR_SCHEDULE, WARMUP_ITERS
    node.GRAD_CLIP = 1.0  # max global gradient norm before each step; 0 = none


@register_cfg_extension
def add_ft_config(cfg):
    node = cfg.TRAINER.FT = CN()
    add_ft_keys(node)


class FineTunedCLIP(PromptedCLIP):
    """CLIP's image encoder + the zero-shot head (see the module docstring).

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: K names.
        templates: format strings with one "{}" (the head's sentences).

    Attributes:
        head: Linear(E, K) with bias; weight exp(logit_scale) * zero-shot weights, bias 0.
        image_encoder: the runner's image tower (trained by FT, frozen by LP).
    """

    def __init__(self, clip, tokenizer, classnames, templates):
        super().__init__(clip)
        weights = self.zero_shot_weights(tokenizer, classnames, templates)
        self.head = nn.Linear(weights.shape[1], weights.shape[0])
        with torch.no_grad():
            self.head.weight.copy_(self.logit_scale * weights)
            self.head.bias.zero_()
        self.image_encoder = clip.visual if clip.visual is not None else clip.plain_visual
        self.trains_encoder = None

    def set_trainable(self, trains_encoder):
        """Train the head, and the image encoder too when ``trains_encoder``; freeze the rest."""
        self.trains_encoder = trains_encoder
        self.requires_grad_(False)
        self.head.requires_grad_(True)
        if trains_encoder:
            self.image_encoder.requires_grad_(True)

    def trainable_parameters(self):
        return [param for param in self.parameters() if param.requires_grad]

    def train(self, mode=True):
        super().train(mode)
        if self.trains_encoder is False:  # a frozen encoder keeps its batch-norm statistics (ResNet towers)
            self.clip.eval()
        return self

    def encode_image_features(self, images):
        """Image features [B, E] (not normalised; what FEATURE_CACHE stores) of images [B, 3, H, W]."""
        return self.clip.encode_image_plain(images)

    def forward_features(self, image_features):
        """Logits [B, K] = head(normalise(features [B, E]))."""
        return self.head(F.normalize(image_features, dim=-1))

    def forward(self, images):
        return self.forward_features(self.encode_image_features(images))


@TRAINER_REGISTRY.register()
class FT(FullFineTuningTrainer):
    """End-to-end fine-tuning; the checkpointed module (folder named after the trainer) holds
    the trained part: image encoder and head."""

    # The head from one template: the classifier's initialisation does not change the step's cost.
    benchmark_cases = (Case("FT/vit_b16.yaml", TRAIN, opts=("TRAINER.FT.TEMPLATE_ENSEMBLE", "False")),)

    node_name = "FT"
    classifier_keys = ("head.weight", "head.bias")
    unseen_classes_refusal = "its classifier is a trained linear head with one row per training class"

    @classmethod
    def trains_encoder(cls, cfg):
        return True

    @classmethod
    def uses_frozen_image_encoder(cls, cfg):
        return not cls.trains_encoder(cfg)

    def check_cfg(self, cfg):
        node, name = cfg.TRAINER[self.node_name], f"TRAINER.{self.node_name}"
        check_range(f"{name}.GRAD_CLIP", node.GRAD_CLIP, minimum=0, why="(0 = no clipping)")
        self.check_fine_tuning_cfg(cfg)

    def build_model(self):
        cfg = self.cfg
        clip, tokenizer = self.build_clip()
        model = FineTunedCLIP(clip, tokenizer, self.classnames, self.head_templates())
        model.set_trainable(self.trains_encoder(cfg))
        self.record_pretrained(model)
        if cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(model, cfg.MODEL.INIT_WEIGHTS)
        self.model = model.to(self.device)
        params = model.trainable_parameters()
        print(f"Learnable parameters: {count_num_param(params=params):,}")
        self.register_fine_tuned(type(self).__name__, self.model, build_optimizer(params, cfg.OPTIM))

    def record_pretrained(self, model):
        """Called with the model as built (pretrained encoder, zero-shot head), before
        MODEL.INIT_WEIGHTS is loaded; L2SP keeps the encoder's weights here."""

    def objective(self, logits, labels):
        """(loss, named extra terms) of a batch: cross-entropy."""
        return F.cross_entropy(logits, labels), {}

    def forward_backward(self, batch):
        inputs, labels = self.parse_batch_train(batch)
        with self.autocast():
            logits = self.network(inputs) if self.feature_cache is None else self.model.forward_features(inputs)
            loss, terms = self.objective(logits, labels)
        self.model_zero_grad()
        self.model_backward(loss, terms)
        self.clip_gradients()
        self.model_update()
        summary = {"loss": loss.item(), **{name: float(value) for name, value in terms.items()}}
        summary["acc"] = compute_accuracy(logits, labels)[0].item()
        return self.finish_step(summary)

    def clip_gradients(self):
        """Scale the gradients to a global norm of at most GRAD_CLIP (after unscaling fp16 ones)."""
        max_norm = self.node.GRAD_CLIP
        if max_norm <= 0 or self._step_skipped:
            return
        (optim,) = self._optims.values()
        if self.amp.scaler is not None:
            self.amp.scaler.unscale_(optim)
        torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), max_norm)
