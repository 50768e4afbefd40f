"""RAda in the full fine-tuning setting (paper §4.1 and appendix C; rada.md §5).

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
(vlprompt/engine/distributed.py).
Checkpoints store the class names of W's rows, so evaluating on a dataset whose classes
are a subset (ImageNet-A/-R) keeps the matching rows.
"""
import math
import os.path as osp

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from yacs.config import CfgNode as CN

from vlprompt.clip import IMAGENET_TEMPLATES, PromptedCLIP, fill_template
from vlprompt.clip.templates import DEFAULT_TEMPLATE, dataset_template
from vlprompt.config import ConfigError, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.distributed import (
    distributed_train_loader, init_distributed, is_main_process, mean_over_processes,
)
from vlprompt.metrics import compute_accuracy
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import count_num_param, load_checkpoint, load_pretrained_weights

from .rada import add_generator_keys, add_mask_loss_keys, build_rational_adapter, check_rada_node

LR_SCHEDULES = ("iteration", "epoch")


@register_cfg_extension
def add_rada_fft_config(cfg):
    node = cfg.TRAINER.RADAFFT = CN()
    node.PREC = "fp16"
    node.TEMPLATE = DEFAULT_TEMPLATE  # classifier sentence when TEMPLATE_ENSEMBLE is False ("" = dataset's)
    add_generator_keys(node)
    add_mask_loss_keys(node)  # ALPHA and MASK_LOSS apply to stage 1
    node.STAGE = 1  # 1: mask generator only (CE + ALPHA * L_mask); 2: everything (CE)
    node.TEMPLATE_ENSEMBLE = True  # classifier from CLIP's 80 ImageNet templates (False: TEMPLATE)
    node.LR_SCHEDULE = "iteration"  # per-iteration warm-up + cosine (WiSE-FT; needs OPTIM.LR_SCHEDULER "cosine"
    # and OPTIM.WARMUP_EPOCH <= 0), or "epoch" (OPTIM.LR_SCHEDULER and OPTIM.WARMUP_*)
    node.WARMUP_ITERS = 500  # linear warm-up iterations of the "iteration" schedule


def iteration_cosine_schedule(optimizer, warmup, total):
    """LR x (i + 1) / warmup for iteration i < warmup, then a cosine from LR to 0 at ``total``."""

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return LambdaLR(optimizer, factor)


def check_iteration_schedule(optim):
    """Raise ConfigError when OPTIM asks for what the "iteration" schedule does not do: it is a
    per-iteration cosine (OPTIM.LR_SCHEDULER must be "cosine") after TRAINER.RADAFFT.WARMUP_ITERS
    linear warm-up iterations (OPTIM.WARMUP_EPOCH must be <= 0: OPTIM.WARMUP_* describe the
    epoch schedule's warm-up)."""
    other = 'or set TRAINER.RADAFFT.LR_SCHEDULE "epoch" to use OPTIM\'s per-epoch schedule and warm-up'
    if optim.LR_SCHEDULER != "cosine":
        raise ConfigError(
            f'OPTIM.LR_SCHEDULER is "{optim.LR_SCHEDULER}", but TRAINER.RADAFFT.LR_SCHEDULE "iteration" supports '
            f'only "cosine" (a per-iteration cosine after TRAINER.RADAFFT.WARMUP_ITERS warm-up iterations): set '
            f'OPTIM.LR_SCHEDULER "cosine", {other}.'
        )
    if optim.WARMUP_EPOCH > 0:
        raise ConfigError(
            f"OPTIM.WARMUP_EPOCH is {optim.WARMUP_EPOCH}, but TRAINER.RADAFFT.LR_SCHEDULE \"iteration\" warms up "
            f"linearly for TRAINER.RADAFFT.WARMUP_ITERS iterations and reads no OPTIM.WARMUP_* key: set "
            f"OPTIM.WARMUP_EPOCH 0, {other}."
        )


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
        device = clip.logit_scale.device
        with torch.no_grad():
            features = [
                F.normalize(self.encode_sentences(tokenizer([fill_template(t, c) for c in classnames]).to(device)), dim=-1)
                for t in templates
            ]
        dim = features[0].shape[1]
        self.classifier = nn.Linear(dim, len(classnames), bias=False)
        self.classifier.weight.data.copy_(F.normalize(torch.stack(features).mean(dim=0), dim=-1))
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
class RAdaFFT(ClipTrainer):
    """RAda / RAda-FT (stage 1 / stage 2); the checkpointed module is the whole model's
    trained part (mask generator; plus image encoder and classifier in stage 2)."""

    supports_distributed = True

    def __init__(self, cfg):
        self.distributed = init_distributed(cfg.USE_CUDA)
        super().__init__(cfg)

    def check_cfg(self, cfg):
        node = cfg.TRAINER.RADAFFT
        check_rada_node(node, "TRAINER.RADAFFT")
        if node.STAGE not in (1, 2):
            raise ConfigError(f"TRAINER.RADAFFT.STAGE must be 1 (mask generator) or 2 (everything), got {node.STAGE}.")
        if node.LR_SCHEDULE not in LR_SCHEDULES:
            raise ConfigError(f"TRAINER.RADAFFT.LR_SCHEDULE must be one of {list(LR_SCHEDULES)}, got '{node.LR_SCHEDULE}'.")
        if node.WARMUP_ITERS < 0:
            raise ConfigError(f"TRAINER.RADAFFT.WARMUP_ITERS must be >= 0, got {node.WARMUP_ITERS}.")
        if node.LR_SCHEDULE == "iteration":
            check_iteration_schedule(cfg.OPTIM)
        if node.STAGE == 2 and not cfg.MODEL.INIT_WEIGHTS:
            print("Note: stage 2 without MODEL.INIT_WEIGHTS starts from an untrained mask generator (RAda-FT "
                  "starts from a stage-1 checkpoint, e.g. <stage 1 dir>/RAdaFFT/model.pth.tar-5)")
        world = self.distributed.world_size if self.distributed else 1
        if cfg.DATALOADER.TRAIN_X.BATCH_SIZE % world:
            raise ConfigError(
                f"DATALOADER.TRAIN_X.BATCH_SIZE ({cfg.DATALOADER.TRAIN_X.BATCH_SIZE}) is the global batch and must "
                f"be divisible by the number of processes ({world})."
            )

    def build_data_loader(self):
        super().build_data_loader()
        if self.distributed is not None:
            cfg = self.cfg
            per_process = cfg.DATALOADER.TRAIN_X.BATCH_SIZE // self.distributed.world_size
            self.train_loader_x = distributed_train_loader(
                self.dm.train_loader_x, self.distributed, per_process, max(cfg.SEED, 0),
                shuffle=cfg.DATALOADER.TRAIN_X.SAMPLER != "SequentialSampler",
            )
            print(f"DistributedDataParallel: {self.distributed.world_size} processes x {per_process} images per step")

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.RADAFFT
        clip, tokenizer = self.build_clip()
        templates = IMAGENET_TEMPLATES if node.TEMPLATE_ENSEMBLE else [dataset_template(self.dm.dataset, node.TEMPLATE)]
        model = RAdaFFTCLIP(clip, tokenizer, self.classnames, templates, node)
        model.set_stage(node.STAGE)
        if cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(model, cfg.MODEL.INIT_WEIGHTS)
        self.model = model.to(self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        print(f"Stage {node.STAGE}: learnable parameters {count_num_param(params=params):,}")
        optim = build_optimizer(params, cfg.OPTIM)
        if node.LR_SCHEDULE == "iteration":
            total = cfg.OPTIM.MAX_EPOCH * len(self.train_loader_x)
            sched = iteration_cosine_schedule(optim, node.WARMUP_ITERS, total)
        else:
            sched = build_lr_scheduler(optim, cfg.OPTIM)
        self.network = self.model
        if self.distributed is not None:
            device_ids = [self.distributed.local_rank] if self.device.type == "cuda" else None
            self.network = DistributedDataParallel(self.model, device_ids=device_ids)
        self.register_model("RAdaFFT", self.network, optim, sched)

    def before_epoch(self):
        super().before_epoch()
        if self.distributed is not None:
            self.train_loader_x.sampler.set_epoch(self.epoch)

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        with self.autocast():
            logits, mask = self.network(images)
            loss, terms = self.model.objective(logits, mask, labels)
        self.model_backward_and_update(loss)
        summary = {"loss": loss.item(), **{name: float(value) for name, value in terms.items()}}
        summary["acc"] = compute_accuracy(logits, labels)[0].item()
        if self.cfg.TRAINER.RADAFFT.LR_SCHEDULE == "iteration" or (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return mean_over_processes(summary, self.device)

    def model_inference(self, input):
        with self.autocast():
            return self.model(input)[0]

    # ------------------------------------------------------------------- files (rank 0 only)
    def init_writer(self, log_dir):
        if is_main_process():
            super().init_writer(log_dir)

    def save_model(self, *args, **kwargs):
        if is_main_process():
            super().save_model(*args, **kwargs)

    def save_results(self):
        if is_main_process():
            return super().save_results()
        return None

    def get_trainer_state(self):
        return dict(super().get_trainer_state(), classnames=list(self.classnames))

    def load_model(self, directory, epoch=None):
        """The engine's load_model; a stored classifier is first reduced to the current classes
        (by name), so a model trained on ImageNet evaluates on ImageNet-A/-R's 200 classes."""
        if not directory:
            return super().load_model(directory, epoch)
        model_file = "model-best.pth.tar" if epoch is None else f"model.pth.tar-{epoch}"
        model_path = osp.join(directory, "RAdaFFT", model_file)
        if not osp.exists(model_path):
            raise FileNotFoundError(self._model_not_found_message(model_path))
        checkpoint = load_checkpoint(model_path)
        state_dict = checkpoint["state_dict"]
        if "classifier.weight" in state_dict:
            state_dict["classifier.weight"] = self._classifier_rows(
                state_dict["classifier.weight"], (checkpoint.get("trainer_state") or {}).get("classnames"), model_path
            )
        print(f'Loading weights to RAdaFFT from "{model_path}" (epoch = {checkpoint["epoch"]})')
        self._load_state_dict_reporting("RAdaFFT", state_dict, set())
        self.weights_epoch = checkpoint["epoch"]

    def _classifier_rows(self, weight, stored_names, model_path):
        current = list(self.classnames)
        if stored_names is None or stored_names == current:
            return weight
        rows = {}  # a name listed twice (ImageNet has a few) maps its k-th use to its k-th row
        for row, name in enumerate(stored_names):
            rows.setdefault(name, []).append(row)
        missing = [name for name in current if name not in rows]
        if missing:
            raise ConfigError(
                f'The classifier in "{model_path}" was trained on {len(stored_names)} classes that do not include '
                f"{len(missing)} class(es) of this dataset (e.g. {missing[:3]}); RAda-FT evaluates only on datasets "
                "whose classes are among its training classes (ImageNet -> ImageNet-V2/-Sketch/-A/-R)."
            )
        print(f"Classifier: keeping the {len(current)} of {len(stored_names)} trained rows that match this dataset's classes")
        used = {name: 0 for name in rows}
        selected = []
        for name in current:
            selected.append(rows[name][min(used[name], len(rows[name]) - 1)])
            used[name] += 1
        return weight[selected]
