"""Skip Tuning (Wu et al., CVPR 2025): full fine-tuning of CLIP's upper blocks, made cheap by
skipping the lower layers (layer-wise skip) and most of the classes (class-wise skip).

Learnable: blocks S..L-1 (0-based, S = START_LAYER = 6 for ViT-B/16) of both towers and their
heads (the image tower's ``ln_post`` and ``proj`` on CLIP, its final norm, attention pool and
projection on other families; the text tower's ``ln_final`` and ``text_projection``); no new
parameters. Everything below block S (embeddings, ``conv1``, ``ln_pre``, blocks 0..S-1) and the
logit scale stay frozen. Class sentences: one hand-written template per dataset (TEMPLATES).

Layer-wise skip. Before each epoch the frozen lower part runs once, without autograd, over every
training image under the training augmentation (one fresh view per image and epoch), and its
output, the hidden states h [N, 1 + P, D_v] at the input of block S, is kept (on the CPU, in the
autocast dtype). The text prefix of the class sentences [C, n, D_t] is a constant (the runner's
prefix cache). The epoch's steps then run only blocks S..L-1 on batches of the cached states.

Class-wise skip. For a batch h [B, 1 + P, D_v] with labels y [B]:
  f = upper image tower(h) [B, E];  sim = f̂ · p̂ᵀ [B, C] against the frozen zero-shot
  prototypes p (the class sentences through the pretrained text tower), sim[b, y_b] := +inf;
  classes ranked by max_b sim[b, c] (descending); rank r is kept when keep[r], a mask [C]
  drawn once per run: keep[r] = 1 for r < n_top = min(⌈TOP_RATIO·C⌉, MAX_TOP), else
  u_r < q(r - n_top), u ~ U(0, 1), q = min-max normalised exponential pdf (scale LAMBDA) on
  linspace(0, 5, C - n_top). The kept classes K' (ascending class order) go through the upper
  text tower from their cached prefix; logits s·f̂·t̂ᵀ [B, K'] with the labels' positions in K';
  loss = CE. With TOP_RATIO 1 or n_top = C every class is kept.

Batches (BATCHES "auto": "same_class" when DATASET.NUM_SHOTS >= 4, else "random"): same_class
forms every batch from one class (per class, its images shuffled and cut into batches of B, the
rest left out; the next batch's class drawn uniformly among the classes with batches left);
random cuts a shuffled list of all images into batches of B (the rest left out).

Inference (every evaluation scope alike: the method has no role-dependent part): the whole
fine-tuned CLIP, s·f̂·t̂ᵀ over all classes of the evaluated dataset.

Resuming continues after the last checkpoint (weights, optimizer, scheduler, RNG states and the
keep mask restored), also from a mid-epoch one (TRAIN.CHECKPOINT_ITERS): the epoch's cached batches
are resumable, their position being the RNG states the epoch's cache and batch plan were drawn from;
a resumed epoch restores those states, draws the same cache (the same augmented views) and plan
again, skips the batches already run and continues with the checkpoint's RNG states, so it ends as
the uninterrupted run.

Recipe (configs/trainers/SkipTuning/vit_b16_bs4.yaml): SGD (momentum 0.9, weight decay 5e-4),
text lr OPTIM.LR 2e-5, image lr IMAGE_LR 5e-6, one warm-up epoch at a constant 1e-6 (both groups),
cosine over 20 epochs, batch 4; EPOCH_DIVISOR 4 for ImageNet, SUN397 and Food101 (table
EPOCH_DIVISORS, read by DATASET.NAME for EPOCH_DIVISOR auto): int(20 / 4) = 5 epochs, the number
the protocol runner loads (``training_epochs``). Checkpoints hold the tuned parameters only (the engine drops frozen
ones): ViT-B/16 6·7,087,872 + 6·3,152,384 + 2·768 + 768·512 + 2·512 + 512·512 = 62,099,456 values.

Verified by reading the official code (Koorye/SkipTuning @ 8c4636ed): trainers/skip_tuning.py
(SkipCustomCLIP: start_layer, select_classes, forward_*_features; SkipTuning: before_train,
before_epoch, extract_image_features with the training transform over a sequential loader of
QUICK_BATCH_SIZE 128, the epochs divided by 4 for ImageNet/SUN397/Food101), trainers/feature_loader.py
('batch_random' for NUM_SHOTS >= 4, else 'random'), trainers/baselines/ft_clip.py (_CUSTOM_TEMPLATES,
the excluded parameters), trainers/_base_/optim.py (STAGED_LR: NEW_LAYERS ['image_encoder'] at
NEW_LR), train.py (SKIP defaults) and configs/trainers/SkipTuning/. Where we differ, and why:

* The keep mask: upstream draws it at the first class selection, which is the torchinfo model
  summary in before_train (random inputs), from the CUDA generator, and does not checkpoint it;
  here it is drawn from torch's CPU generator when the model is built and kept in the
  checkpoints' trainer state, so a resumed run keeps the same mask.
* A batch's true classes are always kept. Upstream forces them in only through their top rank,
  so a batch with more distinct classes than n_top (random batches with few classes) could drop
  one and score it as class 0; same-class batches (the >= 4-shot recipe) never reach that case.
* With C - n_top = 1 the normalised pdf is 0/0 upstream (NaN, so that rank is never kept); here
  its keep probability is 0, the same outcome.
* Precision: upstream trains CLIP's fp16 weights directly (PREC fp16, no master copy); here PREC
  fp16 is autocast with fp32 master weights (the engine's meaning), so small SGD updates are not
  rounded away.
* The cached states are stored in the autocast dtype (fp16 on CUDA, as upstream's fp16 cache) and
  continue in fp32 under autocast.
* Upstream's DROP_RATIO (random token dropping, default 0 in every published config) is not built.
Run side by side with the official code (tools/official_equivalence.py SkipTuning, Koorye/SkipTuning
@ 8c4636ed trainers/skip_tuning.py SkipCustomCLIP with Dassl.pytorch @ c61a1b57, on a seeded random
ViT-B/16, 2 images labelled [0, 0], 3 classes, keep mask [1, 1, 0] set on both sides; fixture
tests/fixtures/official/skiptuning.json, test tests/test_fidelity.py): the
inference logits and the training loss from the block-5 states with the class-wise skip agree
(relative max differences in docs/fidelity.md). tests/test_skip_tuning.py checks the equations above independently.
"""
import math

import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, fill_template
from vlprompt.clip.templates import check_template
from vlprompt.config import ConfigError, check_choice, check_range, register_cfg_extension
from vlprompt.data.data_manager import build_data_loader
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import AUTO, DatasetRule
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import count_num_param, get_rng_state, load_pretrained_weights, set_rng_state

# DATASET.NAME -> the hand-written sentence upstream uses (trainers/baselines/ft_clip.py _CUSTOM_TEMPLATES).
TEMPLATES = {
    "ImageNet": "a photo of a {}.",
    "ImageNetV2": "a photo of a {}.",
    "ImageNetSketch": "a sketch of a {}.",
    "ImageNetA": "a bad photo of a {}.",
    "ImageNetR": "a rendition of a {}.",
    "Caltech101": "itap of a {}.",
    "DescribableTextures": "itap of a {}.",
    "EuroSAT": "a centered satellite photo of {}.",
    "FGVCAircraft": "a bright photo of a {}, a type of aircraft.",
    "Food101": "a photo of the nice {}.",
    "OxfordFlowers": "a close-up photo of a {}.",
    "OxfordPets": "a bad photo of a {}, a type of pet.",
    "SUN397": "a photo of a {}.",
    "StanfordCars": "a photo of the {}, a type of car.",
    "UCF101": "a photo of a {}, a type of sport.",
}
# DATASET.NAME -> divisor of OPTIM.MAX_EPOCH (upstream SkipTuning.__init__); other datasets: 1.
EPOCH_DIVISORS = {"ImageNet": 4, "SUN397": 4, "Food101": 4}
EPOCH_DIVISOR_RULE = DatasetRule("TRAINER.SKIPTUNING.EPOCH_DIVISOR", EPOCH_DIVISORS, default=1,
                                 source="trainers.skip_tuning.EPOCH_DIVISORS")
# auto for a dataset outside TEMPLATES: "", the dataset class's own template.
TEMPLATE_RULE = DatasetRule("TRAINER.SKIPTUNING.TEMPLATE", TEMPLATES, default="", fallback="template",
                            source="trainers.skip_tuning.TEMPLATES")
BATCHES = ("auto", "same_class", "random")


@register_cfg_extension
def add_skip_tuning_config(cfg):
    node = cfg.TRAINER.SKIPTUNING = CN()
    node.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    node.START_LAYER = 6  # S: first tuned block (0-based) of both towers; blocks below are cached
    node.TOP_RATIO = 0.5  # n_top = ceil(TOP_RATIO·C) (a count when > 1), at most MAX_TOP
    node.MAX_TOP = 50
    node.LAMBDA = 0.3  # scale of the exponential pdf over the ranks after n_top
    node.IMAGE_LR = 5e-6  # learning rate of the image tower's tuned part (the text's: OPTIM.LR)
    node.EPOCH_DIVISOR = "auto"  # epochs = int(OPTIM.MAX_EPOCH / divisor); auto: EPOCH_DIVISORS, else 1
    node.TEMPLATE = "auto"  # class sentence; auto: TEMPLATES by DATASET.NAME; "" or auto outside it: the dataset's
    node.BATCHES = "auto"  # same_class, random, or auto (same_class when DATASET.NUM_SHOTS >= 4)
    node.CACHE_BATCH_SIZE = 128  # images per pass of the frozen lower blocks when caching


def num_top_classes(num_classes, top_ratio, max_top):
    """n_top: ⌈top_ratio·C⌉ (top_ratio <= 1) or ⌈min(top_ratio, C)⌉ (a count), at most ``max_top``."""
    top = math.ceil(top_ratio * num_classes) if top_ratio <= 1.0 else math.ceil(min(top_ratio, num_classes))
    return min(top, max_top)


def keep_probabilities(num_classes, num_top, scale):
    """Keep probability of each rank [C]: 1 for ranks < n_top, then the exponential pdf with
    ``scale`` on linspace(0, 5, C - n_top), min-max normalised to [0, 1] (0 for a single rank)."""
    rest = num_classes - num_top
    x = torch.linspace(0.0, 5.0, rest, dtype=torch.float64)
    pdf = torch.exp(-x / scale) / scale
    span = pdf.max() - pdf.min() if rest else 0.0
    tail = (pdf - pdf.min()) / span if rest > 1 else torch.zeros(rest, dtype=torch.float64)
    return torch.cat([torch.ones(num_top, dtype=torch.float64), tail])


def draw_keep_mask(num_classes, num_top, scale, generator=None):
    """keep [C] (bool) over ranks, drawn once per run: rank r kept when u_r < keep_probabilities[r]."""
    probabilities = keep_probabilities(num_classes, num_top, scale)
    return torch.rand(num_classes, generator=generator, dtype=torch.float64) < probabilities


def select_classes(image_features, prototypes, labels, keep_mask):
    """Class-wise skip of one batch.

    Args:
        image_features: [B, E] (any scale). prototypes: [C, E] normalised zero-shot text features.
        labels: [B]. keep_mask: [C] bool over ranks (``draw_keep_mask``).

    Returns:
        (kept class indices [K'] ascending, the labels' positions in them [B]). Classes are ranked
        by their highest similarity to an image of the batch; the batch's classes rank first and
        are always kept.
    """
    similarity = F.normalize(image_features.float(), dim=-1) @ prototypes.float().t()
    batch = torch.arange(labels.shape[0], device=labels.device)
    similarity[batch, labels] = float("inf")
    order = similarity.max(dim=0).values.argsort(descending=True)
    keep = keep_mask.to(order.device).clone()
    keep[: int(labels.unique().numel())] = True  # the batch's classes (ranked first)
    kept = order[keep].sort().values
    positions = torch.searchsorted(kept, labels)
    return kept, positions


def batch_plan(labels, batch_size, same_class, generator=None):
    """The epoch's batches: a list of index tensors [B] into ``labels`` [N].

    same_class: per class, a random order of its items cut into ⌊n_c / B⌋ batches; the batches are
    taken by drawing, each time, a class uniformly among those with batches left. Otherwise a random
    order of all items cut into ⌊N / B⌋ batches. Items past the last full batch are left out.
    """
    if not same_class:
        return _full_batches(torch.randperm(labels.shape[0], generator=generator), batch_size)
    pending = {}
    for label in labels.unique().tolist():
        items = (labels == label).nonzero().flatten()
        chunks = _full_batches(items[torch.randperm(items.numel(), generator=generator)], batch_size)
        if chunks:
            pending[label] = chunks
    plan = []
    while pending:
        classes = list(pending)
        label = classes[int(torch.randint(len(classes), (1,), generator=generator))]
        plan.append(pending[label].pop(0))
        if not pending[label]:
            del pending[label]
    return plan


def _full_batches(items, batch_size):
    """``items`` [n] cut into ⌊n / B⌋ batches of B (the rest left out): a list of [B] tensors."""
    count = items.numel() // batch_size
    return list(items[: count * batch_size].split(batch_size)) if count else []


class EpochDraw:
    """The resumable position of an epoch's cached batches (the engine's sampler interface).

    Args:
        rng_state: the RNG states (``get_rng_state``) the epoch's cache and plan were drawn from.
        batch_size: B.
    """

    def __init__(self, rng_state, batch_size):
        self.rng_state, self.batch_size = rng_state, batch_size
        self.skip = 0

    def state_dict(self):
        """{"rng_state": the states the epoch was drawn from} (for a mid-epoch checkpoint)."""
        return {"rng_state": self.rng_state}

    def resume_epoch(self, state, items_done):
        """Make the next iteration skip the first ``items_done`` items (whole batches) of the epoch
        drawn from ``state``, which the trainer has drawn again."""
        self.skip = items_done // self.batch_size


class CachedPrefixBatches:
    """Stand-in for the training loader over one epoch's cached block-S image states.

    ``len()`` is the number of batches; iterating yields dicts with "hidden" [B, 1 + P, D] and
    "label" [B], in the order of ``plan`` (after a mid-epoch resume, from the first batch not run).

    Attributes:
        sampler: EpochDraw of the epoch. batch_size: B.
    """

    def __init__(self, hidden, labels, plan, rng_state):
        self.hidden, self.labels, self.plan = hidden, labels, plan
        self.batch_size = plan[0].numel()
        self.sampler = EpochDraw(rng_state, self.batch_size)

    def __len__(self):
        return len(self.plan)

    def __iter__(self):
        skip, self.sampler.skip = self.sampler.skip, 0
        for items in self.plan[skip:]:
            yield {"hidden": self.hidden[items], "label": self.labels[items]}


class SkipTuningCLIP(PromptedCLIP):
    """CLIP with its upper blocks fine-tuned; trained from cached block-S states on kept classes.

    Args:
        clip: CLIPRunner with a ViT image tower. tokenizer: Tokenizer. classnames: C names.
        template: sentence with "{}". start_layer: S (0-based, < both towers' depth).

    Attributes:
        token_ids: [C, L] class sentences (buffer, not saved).
        prototypes: [C, E] normalised zero-shot text features of the pretrained towers (buffer,
            not saved), computed at construction, before any weight changes.
        keep_mask: [C] bool over ranks, or None until the trainer sets it (``draw_keep_mask``).
    """

    def __init__(self, clip, tokenizer, classnames, template, start_layer):
        super().__init__(clip)
        depth = min(clip.visual.num_layers, clip.text.num_layers)
        if not 1 <= start_layer < depth:
            raise ConfigError(
                f"TRAINER.SKIPTUNING.START_LAYER must be a block index 1..{depth - 1} of both towers "
                f"({clip.visual.num_layers} image and {clip.text.num_layers} text blocks), got {start_layer}."
            )
        self.start = start_layer
        sentences = [fill_template(template, name) for name in classnames]
        print(f"Skip Tuning sentences: {sentences[:3]}...; tuned blocks {start_layer}.. of both towers")
        self.register_buffer("token_ids", tokenizer(sentences).to(clip.logit_scale.device), persistent=False)
        with torch.no_grad():
            prototypes = F.normalize(self.encode_sentences(self.token_ids).float(), dim=-1)
        self.register_buffer("prototypes", prototypes, persistent=False)
        self.keep_mask = None
        for param in self.parameters():
            param.requires_grad_(False)
        for param in self.text_parameters() + self.image_parameters():
            param.requires_grad_(True)

    def text_parameters(self):
        """The text tower's tuned parameters: blocks S.. and its head (``ln_final``, the projection)."""
        return self.tower_parameters(self.clip.text)

    def image_parameters(self):
        """The image tower's tuned parameters: blocks S.. and its head (CLIP's ``ln_post`` and
        ``proj``; the final norm, attention pool and projection of other families)."""
        return self.tower_parameters(self.clip.visual)

    def tower_parameters(self, tower):
        return [p for block in tower.blocks[self.start:] for p in block.parameters()] + list(tower.head_parameters())

    def compute_text_features(self):
        """t [C, E] (not normalised): the class sentences through the whole text tower."""
        return self.clip.text(self.token_ids).features

    def forward(self, images):
        """s·f̂·t̂ᵀ [B, C] of images [B, 3, H, W] through the whole fine-tuned CLIP."""
        features = F.normalize(self.clip.encode_image(images), dim=-1)
        return self.cosine_logits(features, self.class_text_features().to(features.dtype))

    @torch.no_grad()
    def image_prefix(self, images):
        """h [B, 1 + P, D]: the frozen lower image tower's states at the input of block S."""
        return self.clip.visual.run_prefix(images, self.start)

    def loss(self, hidden, labels):
        """Class-wise skipped CE on cached states.

        Args:
            hidden: [B, 1 + P, D] states at the input of image block S. labels: [B].

        Returns:
            (CE over the kept classes, logits [B, C] with -inf at the skipped classes, {"classes": K'}).
        """
        if self.keep_mask is None:
            raise RuntimeError("SkipTuningCLIP.keep_mask is not drawn yet (draw_keep_mask before training).")
        features = self.clip.visual(hidden=hidden, start=self.start, rows=()).features
        kept, targets = select_classes(features.detach(), self.prototypes, labels, self.keep_mask)
        text_hidden = self.clip.text.prefix(self.token_ids, self.start)[kept]
        text = self.clip.text(self.token_ids[kept], hidden=text_hidden, start=self.start).features
        logits = self.cosine_logits(F.normalize(features, dim=-1), F.normalize(text, dim=-1).to(features.dtype))
        loss = F.cross_entropy(logits, targets)
        full = logits.detach().new_full((labels.shape[0], self.token_ids.shape[0]), float("-inf"))
        full[:, kept] = logits.detach()
        return loss, full, {"classes": float(kept.numel())}


def epoch_divisor(node, dataset):
    """TRAINER.SKIPTUNING.EPOCH_DIVISOR (>= 1), or for auto the EPOCH_DIVISORS entry of ``dataset`` (1 if none)."""
    divisor = EPOCH_DIVISOR_RULE.resolve(node.EPOCH_DIVISOR, dataset)
    check_range("TRAINER.SKIPTUNING.EPOCH_DIVISOR", divisor, minimum=1)
    return divisor


@TRAINER_REGISTRY.register()
class SkipTuning(ClipTrainer):
    """Skip Tuning trainer; the checkpointed module ("SkipTuning") is the model, whose saved state
    is its tuned parameters only. Each epoch trains on a fresh cache of block-S image states."""

    # The step starts from images: the frozen lower blocks (what the per-epoch cache costs per image),
    # then the tuned upper blocks with the class-wise skip.
    benchmark_cases = (Case("SkipTuning/vit_b16_bs4.yaml", TRAIN),)
    compile_graph_breaks = ("class-wise skip: the classes a step keeps depend on its batch (which and how many), "
                            "so the step's text pass has a data-dependent shape")

    vit_required_for = "its tuned upper blocks read cached block inputs"

    @classmethod
    def training_epochs(cls, cfg):
        divisor = epoch_divisor(cfg.TRAINER.SKIPTUNING, cfg.DATASET.NAME)
        return int(cfg.OPTIM.MAX_EPOCH / divisor)

    def check_cfg(self, cfg):
        node = cfg.TRAINER.SKIPTUNING
        check_choice("TRAINER.SKIPTUNING.BATCHES", node.BATCHES, BATCHES)
        if node.TOP_RATIO <= 0:
            raise ConfigError(
                f"TRAINER.SKIPTUNING.TOP_RATIO must be > 0 (a ratio <= 1 or a count), got {node.TOP_RATIO}."
            )
        check_range("TRAINER.SKIPTUNING.MAX_TOP", node.MAX_TOP, minimum=1)
        if node.LAMBDA <= 0:
            raise ConfigError(f"TRAINER.SKIPTUNING.LAMBDA (the pdf's scale) must be > 0, got {node.LAMBDA}.")
        if node.IMAGE_LR < 0:
            raise ConfigError(f"TRAINER.SKIPTUNING.IMAGE_LR must be >= 0, got {node.IMAGE_LR}.")
        check_range("TRAINER.SKIPTUNING.CACHE_BATCH_SIZE", node.CACHE_BATCH_SIZE, minimum=1)
        if node.TEMPLATE != AUTO:
            check_template(node.TEMPLATE, "TRAINER.SKIPTUNING.TEMPLATE")
        if self.training_epochs(cfg) < 1:
            raise ConfigError(
                f"OPTIM.MAX_EPOCH {cfg.OPTIM.MAX_EPOCH} / EPOCH_DIVISOR {epoch_divisor(node, cfg.DATASET.NAME)} "
                f"(TRAINER.SKIPTUNING, by DATASET.NAME {cfg.DATASET.NAME}) leaves no epoch to train."
            )

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.SKIPTUNING
        clip, tokenizer = self.build_clip()
        template = self.dataset_template(TEMPLATE_RULE.resolve(node.TEMPLATE, cfg.DATASET.NAME))
        self.model = SkipTuningCLIP(clip, tokenizer, self.classnames, template, node.START_LAYER).to(self.device)
        if cfg.MODEL.INIT_WEIGHTS:
            load_pretrained_weights(self.model, cfg.MODEL.INIT_WEIGHTS)
        groups = [{"params": self.model.text_parameters(), "lr": cfg.OPTIM.LR},
                  {"params": self.model.image_parameters(), "lr": node.IMAGE_LR}]
        count = sum(count_num_param(params=group["params"]) for group in groups)
        print(f"Learnable parameters of SkipTuning: {count:,}; {self.max_epoch} epochs "
              f"(OPTIM.MAX_EPOCH {cfg.OPTIM.MAX_EPOCH} / {epoch_divisor(node, cfg.DATASET.NAME)})")
        optim_cfg = cfg.OPTIM.clone()
        optim_cfg.defrost()
        optim_cfg.MAX_EPOCH = self.max_epoch
        optim = build_optimizer(groups, optim_cfg)
        self.register_model("SkipTuning", self.model, optim, build_lr_scheduler(optim, optim_cfg))
        # The class-wise skip's keep mask, drawn once per run (resuming restores the run's own).
        classes = len(self.classnames)
        top = num_top_classes(classes, node.TOP_RATIO, node.MAX_TOP)
        self.model.keep_mask = draw_keep_mask(classes, top, node.LAMBDA)
        print(f"Class-wise skip: {classes} classes, the top {top} always kept, "
              f"{int(self.model.keep_mask.sum())} ranks kept by the drawn mask")

    def get_trainer_state(self):
        return dict(super().get_trainer_state(), keep_mask=self.model.keep_mask)

    def set_trainer_state(self, state):
        super().set_trainer_state(state)
        if state.get("keep_mask") is not None:
            self.model.keep_mask = state["keep_mask"]

    # -------------------------------------------------------------------- layer-wise skip
    def before_epoch(self):
        super().before_epoch()
        self.train_loader_x = self.dm.train_loader_x  # frees the previous epoch's cache first
        resumed = self.pending_mid_epoch()
        if resumed is not None:  # an interrupted epoch: draw its cache and plan again
            set_rng_state(resumed["sampler"]["rng_state"])
        rng_state = get_rng_state()
        hidden, labels = self.cache_image_prefix()
        node = self.cfg.TRAINER.SKIPTUNING
        same_class = node.BATCHES == "same_class" or (node.BATCHES == "auto" and self.cfg.DATASET.NUM_SHOTS >= 4)
        plan = batch_plan(labels, self.cfg.DATALOADER.TRAIN_X.BATCH_SIZE, same_class)
        if not plan:
            size = self.cfg.DATALOADER.TRAIN_X.BATCH_SIZE
            advice = (f" (same-class batches: no class has {size} images): lower the batch size or set "
                      "TRAINER.SKIPTUNING.BATCHES random." if same_class else ": lower the batch size.")
            raise ConfigError(
                f"No training batch of DATALOADER.TRAIN_X.BATCH_SIZE {size} can be formed from the {labels.numel()} "
                f"training images{advice}"
            )
        self.train_loader_x = CachedPrefixBatches(hidden, labels, plan, rng_state)

    def cache_image_prefix(self):
        """(h [N, 1 + P, D] on the CPU in the autocast dtype, labels [N]): every training image
        once, under the training augmentation, through the frozen blocks below S."""
        loader = build_data_loader(
            self.cfg, sampler_type="SequentialSampler", data_source=self.dm.dataset.train_x,
            batch_size=self.cfg.TRAINER.SKIPTUNING.CACHE_BATCH_SIZE, tfm=_transform_of(self.dm.train_loader_x),
            is_train=False,
        )
        hidden, labels = [], []
        for batch in loader:
            with self.autocast():
                states = self.model.image_prefix(batch["img"].to(self.device))
            hidden.append(states.to("cpu", self.amp.dtype or states.dtype))
            labels.append(batch["label"])
        return torch.cat(hidden), torch.cat(labels)

    def parse_batch_train(self, batch):
        """(states [B, 1 + P, D] at block S in fp32 on the device, labels [B]): the cached ones of the
        epoch's batches, or for a batch of images ("img" [B, 3, H, W], e.g. tools/benchmark.py) their
        frozen prefix computed here, which is what caching costs per image and epoch."""
        labels = batch["label"].to(self.device)
        if "hidden" in batch:
            return batch["hidden"].to(self.device).float(), labels
        with self.autocast():
            return self.model.image_prefix(batch["img"].to(self.device)).float(), labels


def _transform_of(loader):
    """The transform of the DatasetWrapper behind a loader of ``build_data_loader``."""
    dataset = loader.dataset
    while not hasattr(dataset, "data_source"):
        dataset = dataset.dataset
    return dataset.transform
