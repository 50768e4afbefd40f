"""The zero-shot-head family: CLIP's image encoder under a linear head initialised from the
zero-shot classifier, fine-tuned (FT, WiSE-FT's "standard fine-tuning").

``FineTunedCLIP`` is the model (head W₀ = exp(logit_scale) * zero-shot weights, bias 0, on
L2-normalised image features; the text tower dropped after building the head);
``ZeroShotHeadTrainer`` trains it (cross-entropy, gradient clipping, the full fine-tuning schedule
of vlprompt/engine/fine_tuning.py); ``add_ft_keys`` adds a trainer node's keys. Introduced by FT
(``trainers/ft.py``); LP (head only), LPFT, L2SP and WiSEFT build on it.
"""
import torch
import torch.nn.functional as F
from torch import nn

from vlprompt.clip import PromptedCLIP
from vlprompt.config import check_range
from vlprompt.engine.fine_tuning import FullFineTuningTrainer, add_fine_tuning_keys
from vlprompt.engine.steps import step_summary
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_optimizer
from vlprompt.utils import count_num_param, load_pretrained_weights

__all__ = ["add_ft_keys", "FineTunedCLIP", "ZeroShotHeadTrainer"]


def add_ft_keys(node):
    """The keys every trainer built on FT has: PREC, the head's templates, the schedule, GRAD_CLIP."""
    node.PREC = "fp32"  # wise-ft's clip.load makes every weight fp32
    add_fine_tuning_keys(node)  # TEMPLATE, TEMPLATE_ENSEMBLE, LR_SCHEDULE, WARMUP_ITERS
    node.GRAD_CLIP = 1.0  # max global gradient norm before each step; 0 = none


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


class ZeroShotHeadTrainer(FullFineTuningTrainer):
    """Fine-tuning of ``FineTunedCLIP`` (FT's trainer): image encoder and head with cross-entropy,
    the gradients clipped to GRAD_CLIP; the checkpointed module (folder named after the trainer)
    holds the trained part. A subclass sets ``node_name`` (its node made with ``add_ft_keys``) and
    may train the head alone (``trains_encoder``), add terms to ``objective`` or keep what it needs
    of the pretrained model (``record_pretrained``)."""

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
        return self.finish_step(step_summary(loss, terms, compute_accuracy(logits, labels)[0]))

    def clip_gradients(self):
        """Scale the gradients to a global norm of at most GRAD_CLIP (after unscaling fp16 ones)."""
        max_norm = self.node.GRAD_CLIP
        if max_norm <= 0 or self._step_skipped:
            return
        (optim,) = self._optims.values()
        if self.amp.scaler is not None:
            self.amp.scaler.unscale_(optim)
        torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), max_norm)
