"""FLYP, "Finetune Like You Pretrain" (Goyal et al., CVPR 2023): full fine-tuning of both CLIP
towers with CLIP's own contrastive loss, the class names written into captions.

Captions. Each training image i of class y_i is paired with every template t of the set T (CLIP's
80 ImageNet templates, TEMPLATE_ENSEMBLE; else the one sentence TEMPLATE / the dataset's): the rows
(i, t) form a table of N·|T| (image, caption) pairs, caption_{i,t} = t(name(y_i)). An epoch is as
long as the image loader (⌊N / B⌋ steps of B rows); its N rows are drawn uniformly without
replacement from the N·|T| rows (``CaptionRowSampler``), so an image may come with several of its
captions in one epoch, or none.

Loss. For a batch of B rows, f̂ = normalise(image tower(x)) [B, E], ĝ = normalise(text
tower(caption)) [B, E], s = exp(logit_scale) (learned):
  Z = s·f̂·ĝᵀ [B, B];  L = ½·(CE(Z, [0..B-1]) + CE(Zᵀ, [0..B-1])).
Rows of the same class (even the same caption) are negatives of each other, as upstream.
Everything trains: both towers, their projections and the logit scale.

Inference. The zero-shot head is rebuilt from the current text tower at every evaluation:
  w_c = normalise(mean_t normalise(text tower(t(name_c)))) [C, E];  logits = s·f̂·wᵀ [B, C],
so a model trained on ImageNet evaluates on any class list (ImageNet-A/-R's 200 classes) by
encoding those names. Every evaluation scope is alike (no role-dependent part).

Recipe (configs/trainers/FLYP/vit_b16.yaml): AdamW lr 1e-5, weight decay 0.1 on every parameter,
global batch 512, 10 epochs, 500 linear warm-up iterations then a per-iteration cosine to 0
(OPTIM.LR_SCHEDULER must be "cosine" and OPTIM.WARMUP_EPOCH <= 0), CLIP's training crop
(RandomResizedCrop scale 0.9-1, bicubic), fp32 as upstream. LR_SCHEDULE "epoch" uses OPTIM's
per-epoch schedule and warm-up instead. The schedule, the head's templates and their keys are those of
every full fine-tuning trainer (vlprompt/engine/fine_tuning.py).

Verified by reading the official code (locuslab/FLYP @ 215d5bb6): src/models/flyp_loss.py (the
training loop: AdamW over all parameters, cosine_lr stepped before each step, num_batches = the
image dataset's loader length, the caption iterator continued across epochs, the zero-shot head
rebuilt by get_zeroshot_classifier after every epoch), clip/loss.py (ClipLoss without labels:
the symmetric cross-entropy above, world_size 1), clip/model.py (CLIP.forward normalises both
features and returns logit_scale.exp(); no clamp), src/datasets/laion.py (CsvDataset: one
(caption, image) row per line, shuffled by the DataLoader, last partial batch kept),
datacreation_scripts/imagenet_csv_creator.py (one row per image and template of
openai_imagenet_template), src/models/zeroshot.py (the head), src/models/utils.py (cosine_lr),
src/args.py (warmup_length 500, min_lr 0) and the README's ImageNet command. Where we differ:

* Rows per epoch: upstream continues one shuffled pass over the N·|T| rows across epochs (a row
  comes back only after the whole table is used, about |T| epochs later); here each epoch draws
  its N rows afresh (without replacement within the epoch), a resumable per-epoch sampler.
  Per step the rows are distributed alike: B uniform rows of the table.
* Steps per epoch: upstream's image loader keeps its last partial batch (⌈N / B⌉ steps); the
  engine's training loaders drop it (⌊N / B⌋).
* Parallelism: upstream runs torch.nn.DataParallel on all GPUs, so the loss sees the whole batch
  of 512 (one replica's features gathered on GPU 0; ClipLoss with world_size 1 gathers nothing).
  Here, under torchrun with W processes (DistributedDataParallel, vlprompt/engine/distributed.py),
  process r encodes b = B / W rows of each global batch (``DistributedCaptionRowSampler``), the
  normalised features of all processes are gathered in rank order with their gradients
  (``all_gather_rows``) and every process computes the loss of the whole B x B matrix, so the
  loss, its gradient and the update are those of one process with batch B. Epoch orders under
  torchrun are drawn from (SEED, epoch) rather than from torch's global generator, so they differ
  from a run without torchrun; a killed torchrun run resumes from its last finished epoch.
  tests/test_ddp_gloo.py trains 2 Gloo processes against one process through the same sampler.

Run side by side with the official code (tools/official_equivalence.py FLYP, locuslab/FLYP @
215d5bb6: its clip.load on the weights file, CLIP.forward + ClipLoss on the rows' captions as its
CsvDataset tokenises them, get_zeroshot_classifier's head over openai_imagenet_template; a seeded
random ViT-B/16 with logit_scale drawn away from log(100), 2 images labelled [0, 0] with
templates [3, 41], 3 classes; fixture tests/fixtures/official/flyp.json, test
tests/test_fidelity.py): the contrastive loss and the logits of the rebuilt
80-template head agree (relative max differences in docs/fidelity.md). tests/test_flyp.py checks the equations and the
sampler independently.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler
from torch.utils.data import Dataset as TorchDataset
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, fill_template
from vlprompt.clip.templates import check_template
from vlprompt.config import check_range, register_cfg_extension
from vlprompt.data.data_manager import SeededItems, SeededSampler
from vlprompt.data.samplers import SeededEpochs
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.distributed import all_gather_rows, dataset_wrapper, epoch_seed, item_seeded_loader
from vlprompt.engine.fine_tuning import FullFineTuningTrainer, add_fine_tuning_keys
from vlprompt.engine.steps import step_summary
from vlprompt.optim import build_optimizer
from vlprompt.utils import count_num_param, load_pretrained_weights


@register_cfg_extension
def add_flyp_config(cfg):
    node = cfg.TRAINER.FLYP = CN()
    node.PREC = "fp32"  # upstream trains CLIP in fp32
    add_fine_tuning_keys(node)  # TEMPLATE_ENSEMBLE / TEMPLATE: the captions' and the head's templates;
    # LR_SCHEDULE "iteration" (upstream's) with WARMUP_ITERS, or "epoch"
    node.HEAD_BATCH_SIZE = 1000  # sentences per text-tower pass when the zero-shot head is rebuilt


class CaptionRowSampler(SeededEpochs, Sampler):
    """Row indices r = i·T + t (image i, template t) of the N·T caption table, N per epoch.

    Each epoch draws one 64-bit seed from torch's global generator and yields the first N entries
    of ``torch.randperm(N·T)`` of a generator seeded with it (with T = 1 the order of the engine's
    RandomSampler). Resumable mid-epoch like the engine's samplers.
    """

    def __init__(self, num_images, num_templates):
        self.num_images, self.num_templates = num_images, num_templates

    def __len__(self):
        return self.num_images

    def __iter__(self):
        generator, skip = self.epoch_generator()
        rows = torch.randperm(self.num_images * self.num_templates, generator=generator)[: self.num_images]
        yield from rows[skip:].tolist()


class DistributedCaptionRowSampler(Sampler):
    """This process's (row, item seed) pairs of each epoch's caption rows under torchrun.

    Epoch e uses the first S·B entries of ``torch.randperm(N·T)`` of a generator seeded with
    h(seed, e) (``epoch_seed``, the same on every process; S = ⌊N / B⌋ steps of the global batch
    B). Step i's global batch is entries [i·B, (i+1)·B), of which process r takes the b = B / W
    consecutive entries starting at i·B + r·b: the rows of all processes, gathered in rank order,
    are the global batch in its order. Row k is read with the seed (h(seed, e) + k) mod 2**63
    (``RestoringSeededItems``), whichever process reads it. Call ``set_epoch`` before each epoch.
    """

    def __init__(self, num_images, num_templates, batch_size, context, seed):
        self.num_images, self.num_templates = num_images, num_templates
        self.batch_size, self.context, self.seed, self.epoch = batch_size, context, seed, 0
        self.steps = num_images // (batch_size * context.world_size)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.steps * self.batch_size

    def __iter__(self):
        seed = epoch_seed(self.seed, self.epoch)
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randperm(self.num_images * self.num_templates, generator=generator)
        world, rank, size = self.context.world_size, self.context.rank, self.batch_size
        mine = rows[: self.steps * world * size].view(self.steps, world, size)[:, rank].flatten()
        for row in mine.tolist():
            yield row, (seed + row) % 2**63


class CaptionRows(TorchDataset):
    """Row r of the caption table: item r // T of the image dataset with "template": r % T."""

    def __init__(self, images, num_templates):
        self.images, self.num_templates = images, num_templates

    def __len__(self):
        return len(self.images) * self.num_templates

    def __getitem__(self, row):
        image, template = divmod(row, self.num_templates)
        return dict(self.images[image], template=template)


def caption_row_loader(loader, num_templates):
    """The training loader over (image, template) rows built from the engine's image loader
    ``loader`` (its dataset wrapper, transform, batch size, workers and drop_last rule), as long as
    ``loader``: batches add "template" [B] to the image loader's keys."""
    images = loader.dataset
    seeded = isinstance(images, SeededItems)
    rows = CaptionRows(images.dataset if seeded else images, num_templates)
    sampler = CaptionRowSampler(len(rows.images), num_templates)
    extra = {}
    if seeded:
        rows, sampler = SeededItems(rows), SeededSampler(sampler)
        extra = {"persistent_workers": True, "generator": torch.Generator()}
    return DataLoader(rows, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
                      drop_last=loader.drop_last, pin_memory=loader.pin_memory, **extra)


def distributed_caption_row_loader(loader, num_templates, context, batch_size, seed):
    """This process's training loader over (image, template) rows under torchrun: ``batch_size``
    (the global batch / W) rows per step from ``DistributedCaptionRowSampler``, built on the
    dataset wrapper of the engine's image loader ``loader``."""
    images = dataset_wrapper(loader)
    sampler = DistributedCaptionRowSampler(len(images), num_templates, batch_size, context, seed)
    return item_seeded_loader(CaptionRows(images, num_templates), sampler, batch_size, loader)


def contrastive_loss(image_features, text_features, scale):
    """CLIP's symmetric InfoNCE: (loss, Z [B, B]) for normalised features [B, E] of B pairs and the
    temperature s (a 0-dim tensor); row b's positive is column b, every other column a negative."""
    logits = scale * image_features @ text_features.t()
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2, logits


class FLYPCLIP(PromptedCLIP):
    """CLIP with every weight trainable, scored through its zero-shot head.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names. templates: T sentences with "{}".
        head_batch_size: sentences per text-tower pass when the head is built.

    Attributes:
        token_ids: [T, C, L] the caption of every (template, class) (buffer, not saved).
    """

    def __init__(self, clip, tokenizer, classnames, templates, head_batch_size=1000):
        super().__init__(clip)
        sentences = [fill_template(template, name) for template in templates for name in classnames]
        token_ids = tokenizer(sentences).view(len(templates), len(classnames), -1)
        self.register_buffer("token_ids", token_ids.to(clip.logit_scale.device), persistent=False)
        # the last position of the longest caption: a batch's captions are computed up to it, so the
        # text tower never reads a batch's own longest position from the device
        self.caption_last = int(clip.text.eot_positions(token_ids.flatten(0, 1)).max())
        self.head_batch_size = head_batch_size
        self.requires_grad_(True)

    def captions(self, labels, templates):
        """Token ids [B, L] of the rows' captions t_b(name(y_b)) for labels [B] and templates [B]."""
        return self.token_ids[templates, labels]

    def loss(self, images, labels, templates, network=None):
        """(L, Z [B, B], {"scale": s}) of images [b, 3, H, W] and their captions (labels, templates [b]).

        ``network`` runs the forward (default: this model; under torchrun its DistributedDataParallel
        wrapper). In a process group the W processes' features are gathered first (B = W·b), so
        every process computes the loss of the whole global batch; otherwise B = b.
        """
        image_features, text_features, scale = (network or self)(images, self.captions(labels, templates))
        loss, logits = contrastive_loss(all_gather_rows(image_features), all_gather_rows(text_features), scale)
        return loss, logits, {"scale": scale.detach()}

    def compute_text_features(self):
        """The zero-shot head [C, E] (normalised by ``class_text_features``): per class, the mean of
        its T normalised caption features."""
        sentences = self.token_ids.flatten(0, 1)
        features = torch.cat([F.normalize(self.clip.encode_text(chunk, last=self.caption_last).float(), dim=-1)
                              for chunk in sentences.split(self.head_batch_size)])
        return features.view(*self.token_ids.shape[:2], -1).mean(dim=0)

    def forward(self, images, captions=None):
        """s·f̂·wᵀ [B, C] of images [B, 3, H, W] against the head rebuilt from the current text tower;
        with ``captions`` (token ids [B, L]) the training step's (f̂ [B, E], ĝ [B, E], s), the
        normalised features of the B (image, caption) rows and the temperature."""
        image_features = F.normalize(self.clip.encode_image_plain(images).float(), dim=-1)
        if captions is None:
            return self.cosine_logits(image_features, self.class_text_features())
        text_features = F.normalize(self.clip.encode_text(captions, last=self.caption_last).float(), dim=-1)
        return image_features, text_features, self.logit_scale.float()


def benchmark_template_keys(trainer, batch_size):
    """What the training loader adds to a cost-benchmark batch (its case's ``batch_keys``): each image's
    caption template index [B], cycling over the T templates."""
    return {"template": torch.arange(batch_size) % len(trainer.model.token_ids)}


@TRAINER_REGISTRY.register()
class FLYP(FullFineTuningTrainer):
    """FLYP trainer; the checkpointed module ("FLYP") is the whole CLIP. Runs as one process or
    under torchrun (see "Parallelism" above)."""

    # The loader gives each image one of its templates (80 in vit_b16.yaml; the step encodes B
    # captions and B images).
    benchmark_cases = (Case("FLYP/vit_b16.yaml", TRAIN, batch_keys=benchmark_template_keys),)

    node_name = "FLYP"

    def check_cfg(self, cfg):
        node = cfg.TRAINER.FLYP
        check_template(node.TEMPLATE, "TRAINER.FLYP.TEMPLATE")
        check_range("TRAINER.FLYP.HEAD_BATCH_SIZE", node.HEAD_BATCH_SIZE, minimum=1)
        self.check_fine_tuning_cfg(cfg)

    @property
    def templates(self):
        """The T caption and head templates (TRAINER.FLYP.TEMPLATE_ENSEMBLE / TEMPLATE)."""
        return list(self.head_templates())

    def build_data_loader(self):
        super().build_data_loader()
        if self.distributed is None:
            self.train_loader_x = caption_row_loader(self.dm.train_loader_x, len(self.templates))

    def build_distributed_train_loader(self, batch_size):
        return distributed_caption_row_loader(self.dm.train_loader_x, len(self.templates), self.distributed,
                                              batch_size, max(self.cfg.SEED, 0))

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.FLYP
        clip, tokenizer = self.build_clip()
        print(f"FLYP captions: {len(self.templates)} template(s) x {len(self.classnames)} classes, "
              f"e.g. '{fill_template(self.templates[0], self.classnames[0])}'")
        model = FLYPCLIP(clip, tokenizer, self.classnames, self.templates, node.HEAD_BATCH_SIZE)
        if cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(model, cfg.MODEL.INIT_WEIGHTS)
        self.model = model.to(self.device)
        params = list(model.parameters())
        print(f"Learnable parameters of FLYP: {count_num_param(params=params):,}")
        self.register_fine_tuned("FLYP", self.model, build_optimizer(params, cfg.OPTIM))

    def parse_batch_train(self, batch):
        return batch["img"].to(self.device), batch["label"].to(self.device), batch["template"].to(self.device)

    def forward_backward(self, batch):
        """One step; logs the loss, the temperature s ("scale") and the in-batch image-to-caption
        accuracy ("acc": row b's best caption is its own; a same-class row's identical caption ties),
        all of the global batch."""
        images, labels, templates = self.parse_batch_train(batch)
        with self.autocast():
            loss, logits, terms = self.model.loss(images, labels, templates, self.network)
        self.model_backward_and_update(loss, terms=terms)
        targets = torch.arange(logits.shape[0], device=logits.device)
        accuracy = (logits.argmax(dim=1) == targets).float().mean() * 100
        return self.finish_step(step_summary(loss, terms, accuracy))
