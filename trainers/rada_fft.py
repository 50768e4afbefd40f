"""RAda in the full fine-tuning setting (paper §4.1 and appendix C).

The text encoder is replaced by a linear classifier W [K, D] initialised with the normalised
class text features (CLIP's 80 ImageNet templates by default, as WiSE-FT/FLYP); the
rational matrix uses W's rows: logits = tau * sum_d M[c, d] f_d W[c, d]. Two stages, chained
through MODEL.INIT_WEIGHTS (LP-FT style):

* stage 1 ("RAda"): only the mask generator trains, loss = CE + ALPHA * L_mask;
* stage 2 ("RAda-FT"): image encoder, classifier and mask generator all train, loss = CE,
  starting from the stage-1 checkpoint of a chosen epoch (paper: epoch 5 of 10).

Recipe (configs/trainers/RAdaFFT): AdamW, weight decay 0.1, batch 512, lr 0.004 (stage 1) /
4e-6 (stage 2), 500 linear warm-up iterations then a per-iteration cosine (LR_SCHEDULE
"iteration": OPTIM.LR_SCHEDULER must be "cosine" and OPTIM.WARMUP_EPOCH <= 0, else a
ConfigError; LR_SCHEDULE "epoch" uses OPTIM's per-epoch schedule and warm-up). Runs as one
process, or under ``torchrun`` with DistributedDataParallel: DATALOADER.TRAIN_X.BATCH_SIZE
stays the global batch, each of the N processes takes BATCH_SIZE / N images per step
(vlprompt/engine/distributed.py; shared with the other full fine-tuning trainers in
vlprompt/engine/fine_tuning.py).
Checkpoints store the class names of W's rows, so evaluating on a dataset whose classes
are a subset (ImageNet-A/-R) keeps the matching rows.
"""
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP
from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.fine_tuning import FullFineTuningTrainer, add_fine_tuning_keys
from vlprompt.engine.steps import step_summary
from vlprompt.methods.rada import add_generator_keys, add_mask_loss_keys, build_rational_adapter, check_rada_node
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_optimizer
from vlprompt.run_layout import epoch_checkpoint_name
from vlprompt.utils import count_num_param, load_pretrained_weights


@register_cfg_extension
def add_rada_fft_config(cfg):
    node = cfg.TRAINER.RADAFFT = CN()
    node.PREC = "fp16"
    add_generator_keys(node)
    add_mask_loss_keys(node)  # ALPHA and MASK_LOSS apply to stage 1
    node.STAGE = 1  # 1: mask generator only (CE + ALPHA * L_mask); 2: everything (CE)
    add_fine_tuning_keys(node)  # TEMPLATE, TEMPLATE_ENSEMBLE, LR_SCHEDULE, WARMUP_ITERS


class RAdaFFTCLIP(PromptedCLIP):
    """CLIP's image encoder + linear classifier + RAda mask generator.

    Args:
        clip: CLIPRunner (frozen until ``set_stage``). tokenizer: Tokenizer.
        classnames: K names. templates: sentence templates for the classifier's init.
        node: cfg.TRAINER.RADAFFT.

    Attributes:
        classifier: Linear without bias, weight [K, D] = mean normalised template features.
        rational: RationalAdapter (logits and loss). mask_generator: its generator.
    """

    def __init__(self, clip, tokenizer, classnames, templates, node):
        super().__init__(clip)
        weights = self.zero_shot_weights(tokenizer, classnames, templates)
        dim = weights.shape[1]
        self.classifier = nn.Linear(dim, len(classnames), bias=False)
        self.classifier.weight.data.copy_(weights)
        self.rational = build_rational_adapter(node, dim)
        self.mask_generator = self.rational.generator
        self.stage = None

    def set_stage(self, stage):
        """Stage 1 trains the mask generator; stage 2 also the image encoder and the classifier."""
        self.stage = stage
        image_encoder = self.clip.visual if self.clip.visual is not None else self.clip.plain_visual
        for param in self.parameters():
            param.requires_grad_(False)
        trained = [self.mask_generator] + ([image_encoder, self.classifier] if stage == 2 else [])
        for module in trained:
            module.requires_grad_(True)

    def train(self, mode=True):
        super().train(mode)
        if self.stage == 1:  # a frozen encoder keeps its batch-norm statistics (ResNet towers)
            self.clip.eval()
        return self

    def forward(self, images):
        """(logits [B, K], mask [B, K, D]) for images [B, 3, H, W]."""
        image_features = F.normalize(self.clip.encode_image_plain(images), dim=-1)
        return self.rational(image_features, self.classifier.weight, self.logit_scale)

    def objective(self, logits, mask, labels):
        """(loss, terms): CE + ALPHA * L_mask in stage 1, CE in stage 2."""
        ce = F.cross_entropy(logits, labels)
        if self.stage == 2:
            return ce, {}
        return self.rational.regularised(ce, mask)


@TRAINER_REGISTRY.register()
class RAdaFFT(FullFineTuningTrainer):
    """RAda / RAda-FT (stage 1 / stage 2); the checkpointed module is the whole model's
    trained part (mask generator; plus image encoder and classifier in stage 2)."""

    # The classifier's initialisation (80 templates or one) does not change the step's cost.
    benchmark_cases = (
        Case("RAdaFFT/vit_b16_stage2.yaml", TRAIN, opts=("TRAINER.RADAFFT.TEMPLATE_ENSEMBLE", "False"),
             synthetic="RAdaFFT/synthetic_stage2.yaml"),
        Case("RAdaFFT/vit_b16_stage1.yaml", TRAIN, name="RAdaFFT stage 1", opts=("TRAINER.RADAFFT.TEMPLATE_ENSEMBLE", "False"),
             synthetic="RAdaFFT/synthetic_stage1.yaml"),
    )

    node_name = "RADAFFT"
    classifier_keys = ("classifier.weight",)
    unseen_classes_refusal = "its classifier is a trained linear layer with one row per training class"

    def check_cfg(self, cfg):
        node = cfg.TRAINER.RADAFFT
        check_rada_node(node, "TRAINER.RADAFFT")
        if node.STAGE not in (1, 2):
            raise ConfigError(f"TRAINER.RADAFFT.STAGE must be 1 (mask generator) or 2 (everything), got {node.STAGE}.")
        self.check_fine_tuning_cfg(cfg)
        if node.STAGE == 2 and not cfg.MODEL.INIT_WEIGHTS:
            print("Note: stage 2 without MODEL.INIT_WEIGHTS starts from an untrained mask generator (RAda-FT "
                  f"starts from a stage-1 checkpoint, e.g. <stage 1 dir>/RAdaFFT/{epoch_checkpoint_name(5)})")

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.RADAFFT
        clip, tokenizer = self.build_clip()
        model = RAdaFFTCLIP(clip, tokenizer, self.classnames, self.head_templates(), node)
        model.set_stage(node.STAGE)
        if cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(model, cfg.MODEL.INIT_WEIGHTS)
        self.model = model.to(self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        print(f"Stage {node.STAGE}: learnable parameters {count_num_param(params=params):,}")
        self.register_fine_tuned("RAdaFFT", self.model, build_optimizer(params, cfg.OPTIM))

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        with self.autocast():
            logits, mask = self.network(images)
            loss, terms = self.model.objective(logits, mask, labels)
        self.model_backward_and_update(loss)
        return self.finish_step(step_summary(loss, terms, compute_accuracy(logits, labels)[0]))

    def model_inference(self, input):
        with self.autocast():
            return self.model(input)[0]
