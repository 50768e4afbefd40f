"""TAC: Task-Aware Clustering for prompting vision-language models (Hao et al., CVPR 2025).

Deep prompts in both towers (as PromptSRC) plus K task-aware cluster tokens shared by them:

* Cluster centres G [K, E] (K = N_CLUSTERS, 5): each training class c is embedded as
  ê_c = normalise(mean over its descriptions of the frozen-CLIP text features) [E] (the
  features are averaged unnormalised, as upstream); cosine k-means over {ê_c} gives K centres,
  normalised. G is fitted once when training starts (k-means seeded by SEED) and is a
  persistent buffer: frozen as upstream (``nn.Embedding.from_pretrained`` freezes it), saved in
  every checkpoint, and used for every evaluated class list (the base centres on new classes
  and on targets), so evaluation needs no descriptions.
* G_t = Linear(E -> D_t)(G) [K, D_t] and G_v = Linear(E -> D_v)(G) [K, D_v] (learned).
* Text (C classes): [SOS; G_t; T_1; the sentence "a photo of a {class}." from its first word]
  [C, L, D_t] cut to L (its last K + n_t positions dropped); positional embeddings on all
  positions. T_1 [n_t, D_t] starts as the first n_t token embeddings after SOS of the tokenised
  CTX_INIT (for n_t 5: "a photo of a" and its end-of-text token; longer contexts also take
  padding embeddings), N(0, 0.02) without a phrase. Blocks 1..J_t-1 (0-based) replace positions
  1..K with G_t and K+1..K+n_t with T_l ~ N(0, 0.02). Pooled at the sentence's EOT + K + n_t.
* Image: [CLS; patches (P); G_v; V_1] after the positional embedding (the K + n_v appended
  tokens get none); blocks 1..J_v-1 replace the last K + n_v positions with [G_v; V_l],
  V_l ~ N(0, 0.02) [n_v, D_v]. In every block an additive mask keeps the P patch rows from
  attending to the K G_v columns; CLS, G_v and V attend everything.
  f = Dropout(DROPOUT)(LN_post(x_CLS) proj) [B, E] (active in training only; its mask is drawn
  from the CPU generator, so a seed gives the same masks on the CPU and on CUDA).
* Loss of a step with B images and V = DATALOADER.K_TRANSFORMS augmented views each (view-major
  [V B, 3, H, W]): z = s f̂ t̂ᵀ [V B, C],
  L = CE(z, y) + λ_t mean|t̂ − ê| + λ_i mean|f̂ − f̂_0| (element means), λ_t 20, λ_i 25, where
  f̂_0 [B, E] are the normalised frozen-CLIP features of the un-augmented images x_0
  (DATALOADER.RETURN_IMG0), repeated for the V views. As upstream, f_0 passes through the same
  dropout during training (upstream's frozen image encoder carries it and is in training mode).
* Final weights: after every epoch e = 1..E the learnable tensors are added to a running sum
  with weight 1/E; after the last epoch the average replaces them (it is what
  model.pth.tar-E holds and what is evaluated). The sum is in every checkpoint (trainer state),
  so a killed and resumed run ends with the same average.

Inference is the same for every evaluation scope (base, new, source, target): the trained centres
and maps, the prompts, and the class sentences of the evaluated classes.

Verified by reading the official code (FushengHao/TAC @ 914c3067): trainers/tac.py
(``VLPromptLearner``: ctx from ``embedding[0, 1:1+n_ctx]`` of the tokenised phrase, suffix =
``embedding[:, 1:-n_ctx-5]``, k-means over the description means, centres frozen; ``CustomCLIP``:
the maps, the pooled position argmax + n_ctx + 5, the losses of ``forward_backward``, the
uniform ``ep_model_weights``), clip/model.py (``ResidualAttentionBlock_IVLP``: centres re-inserted
with the prompts of every prompted block in both towers; ``VisionTransformer.define_mask``:
patch rows x centre columns -inf in every block; dropout 0.3 after the projection), configs/
trainers/TAC/{basetonovel,crossdatasets}.yaml. Differences: upstream averages the whole fp16
state dict, frozen CLIP weights included (their rounding changes slightly); here only the
learnable tensors are averaged, in fp32. Upstream switches the context to random init above
20 tokens; here a phrase always initialises it. The paper calls the centres
trainable; the code at that commit keeps them frozen, and the code wins.

Run side by side with the official code (vlprompt_app/fidelity/methods/tac.py, fixture
tests/fixtures/official/tac.json): FushengHao/TAC @ 914c3067 with Dassl.pytorch @ c61a1b57 on a
seeded random ViT-B/16, every learnable value at 10x its init std and the same seeded centres:
the logits and the training loss over 2 views agree (relative max differences in docs/fidelity.md;
image dropout off; upstream rounds its prompts to fp16 inside the towers).
"""
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import (
    InsertTokens, Plan, PromptedCLIP, PromptTooLongError, ReplaceTokens, check_prompt_depth, prompt_parameters,
    read_reference_checkpoints, tower_depths,
)
from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.data.descriptions import (
    DescriptionsError, check_descriptions_file, descriptions_file, read_class_descriptions,
)
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.prompt_aggregation import GaussianPromptAggregation


SENTENCES_PER_PASS = 1024
KMEANS_MAX_ITERATIONS = 300
KMEANS_TOLERANCE = 1e-4
# Upstream parameter names (whole-model checkpoints) -> ours; deep prompts and frozen CLIP
# weights are handled by read_reference_checkpoints.
_REFERENCE_NAMES = (
    ("prompt_learner.ctx", "ctx"),
    ("prompt_learner.topk", "centres"),
    ("VPT_topk_t.", "text_map."),
    ("VPT_topk_v.", "vision_map."),
)


@register_cfg_extension
def add_tac_config(cfg):
    cfg.TRAINER.TAC = CN()
    cfg.TRAINER.TAC.N_CTX_VISION = 5  # vision prompt tokens per layer
    cfg.TRAINER.TAC.N_CTX_TEXT = 5  # text prompt tokens per layer
    cfg.TRAINER.TAC.CTX_INIT = "a photo of a"  # init phrase of the layer-1 text context and the sentence's start
    cfg.TRAINER.TAC.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.TAC.PROMPT_DEPTH_VISION = 12  # layers with vision prompts and cluster tokens (>= 1)
    cfg.TRAINER.TAC.PROMPT_DEPTH_TEXT = 12  # layers with text prompts and cluster tokens (>= 1)
    cfg.TRAINER.TAC.TEXT_LOSS_WEIGHT = 20  # λ_t of L1(t̂, description embeddings)
    cfg.TRAINER.TAC.IMAGE_LOSS_WEIGHT = 25  # λ_i of L1(f̂, frozen features of the un-augmented image)
    cfg.TRAINER.TAC.N_CLUSTERS = 5  # K cluster tokens (upstream: 5, hard-coded)
    cfg.TRAINER.TAC.DROPOUT = 0.3  # dropout on the image feature (upstream: 0.3, hard-coded)
    # Folder of the per-dataset <stem>_prompt.json files (upstream's descriptions/);
    # "" = DATASET.ROOT/descriptions. Synthetic sets write theirs there on first use.
    cfg.TRAINER.TAC.DESCRIPTIONS = ""


def cosine_kmeans(points, k, generator):
    """K-means with cosine distance, as upstream's ``kmeans(distance='cosine')``.

    Starts from k distinct points drawn with ``generator``; each round assigns every point to
    the centre of highest cosine similarity and moves each centre to the plain mean of its
    points (an empty cluster restarts from a random point), until the squared summed centre
    shift is below KMEANS_TOLERANCE (at most KMEANS_MAX_ITERATIONS rounds).

    Args:
        points: [N, E] (N >= k), on the CPU.
        generator: torch.Generator (CPU).

    Returns:
        [k, E] normalised centres.
    """
    n = points.shape[0]
    if n < k:
        raise ValueError(f"k-means needs at least {k} points for {k} clusters, got {n}.")
    centres = points[torch.randperm(n, generator=generator)[:k]].clone()
    unit = F.normalize(points, dim=-1)
    for _ in range(KMEANS_MAX_ITERATIONS):
        assignment = (unit @ F.normalize(centres, dim=-1).t()).argmax(dim=1)
        moved = torch.stack([
            points[assignment == j].mean(dim=0) if bool((assignment == j).any())
            else points[int(torch.randint(n, (1,), generator=generator))]
            for j in range(k)
        ])
        shift = (moved - centres).norm(dim=1).sum() ** 2
        centres = moved
        if shift < KMEANS_TOLERANCE:
            break
    return F.normalize(centres, dim=-1)


class CPUDrawnDropout(nn.Module):
    """Dropout whose keep mask is drawn from the CPU's default generator and then moved to the
    input's device, so a seed gives the same masks on every device (``nn.Dropout`` draws from the
    device's own generator). On a CPU fp32 input it draws and computes exactly what ``nn.Dropout``
    does (a Bernoulli(1 - p) tensor of the input's shape, divided by 1 - p, times the input).

    Args:
        p: the probability of zeroing an element.
    """

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        """x [..., E] -> the same shape; the identity in eval mode or with p = 0."""
        if not self.training or self.p == 0:
            return x
        noise = torch.empty(x.shape, dtype=torch.float32).bernoulli_(1 - self.p).div_(1 - self.p)
        return x * noise.to(x.device, x.dtype)


class TACCLIP(PromptedCLIP):
    """Frozen CLIP with TAC's cluster tokens and deep prompts (see the module docstring).

    Args:
        clip: CLIPRunner with a ViT image tower. tokenizer: Tokenizer. classnames: C names.
        node: cfg.TRAINER.TAC.

    Attributes:
        centres: buffer G [K, E] (NaN until ``fit_descriptions``; saved).
        text_map, vision_map: Linear(E, D_t), Linear(E, D_v).
        ctx: T_1 [n_t, D_t]. text_prompts: T_2..T_Jt, each [n_t, D_t].
        vision_prompts: V_1..V_Jv, each [n_v, D_v].
        patch_mask: buffer [L_v, L_v], L_v = 1 + P + K + n_v: -inf at (patch row, G_v column).
        description_targets: ê [C, E] of the training classes (None before ``fit_descriptions``).
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        text, visual = clip.text, clip.visual
        self.tokenizer = tokenizer
        self.n_clusters, self.n_text, self.n_vision = node.N_CLUSTERS, node.N_CTX_TEXT, node.N_CTX_VISION
        self.weights = {"text": node.TEXT_LOSS_WEIGHT, "image": node.IMAGE_LOSS_WEIGHT}
        embed_dim = visual.output_dim
        self.register_buffer("centres", torch.full((self.n_clusters, embed_dim), float("nan")))
        self.text_map = nn.Linear(embed_dim, text.width)
        self.vision_map = nn.Linear(embed_dim, visual.width)
        init = node.CTX_INIT.replace("_", " ").strip()
        self.phrase = init or " ".join(["X"] * self.n_text)
        self.ctx = nn.Parameter(self._initial_context(init))
        self.text_prompts = prompt_parameters(node.PROMPT_DEPTH_TEXT - 1, self.n_text, text.width)
        self.vision_prompts = prompt_parameters(node.PROMPT_DEPTH_VISION, self.n_vision, visual.width)
        self.dropout = CPUDrawnDropout(node.DROPOUT)
        self.register_buffer("patch_mask", self._patch_mask(), persistent=False)
        self.description_targets = None
        self.set_classnames(classnames)
        print(f'TAC: {self.n_clusters} cluster tokens; text context "{self.phrase}" ({self.n_text} tokens, depth '
              f"{node.PROMPT_DEPTH_TEXT}), {self.n_vision} vision tokens (depth {node.PROMPT_DEPTH_VISION})")
        self.register_load_state_dict_pre_hook(_rename_reference_keys)
        read_reference_checkpoints(self)

    def _initial_context(self, init):
        if not init:
            return torch.empty(self.n_text, self.clip.text.width).normal_(std=0.02)
        ids = self.tokenizer([init]).to(self.clip.logit_scale.device)
        start = self.tokenizer.start_tokens
        with torch.no_grad():
            return self.clip.text.embed(ids)[0, start:start + self.n_text].float().clone()

    def _patch_mask(self):
        """[L, L]: the patches do not attend to the cluster tokens (L = prefix tokens + P patches + K + n_v)."""
        layout = self.clip.visual.layout
        first, patches = layout.prefix_tokens, layout.num_patches
        length = layout.length + self.n_clusters + self.n_vision
        mask = torch.zeros(length, length)
        mask[first:first + patches, first + patches:first + patches + self.n_clusters] = float("-inf")
        return mask.to(self.clip.logit_scale.device)

    def set_classnames(self, classnames):
        """Class-dependent buffers (not saved): token_prefix [C, s, D_t] (the tokenizer's s start
        tokens: SOS), token_suffix [C, L-s-K-n_t, D_t] (the sentence from its first word, cut), eot [C]
        (pooled positions)."""
        text, shift, start = self.clip.text, self.n_clusters + self.n_text, self.tokenizer.start_tokens
        sentences = [f"{self.phrase} {name.replace('_', ' ')}." for name in classnames]
        ids = self.tokenizer(sentences, reserve=shift).to(self.clip.logit_scale.device)
        with torch.no_grad():
            embedded = text.embed(ids).float()
        self.register_buffer("token_prefix", embedded[:, :start], persistent=False)
        self.register_buffer("token_suffix", embedded[:, start:ids.shape[1] - shift], persistent=False)
        self.register_buffer("eot", text.eot_positions(ids) + shift, persistent=False)
        self.classnames = list(classnames)

    def centres_fitted(self):
        """Whether G holds fitted (or loaded) centres (reads the device once)."""
        return not bool(torch.isnan(self.centres).any())

    def fit_descriptions(self, descriptions, generator):
        """Set ê from the descriptions of the current classes and, if G is not fitted yet (a
        fresh run; a resumed one has it from its checkpoint), fit G by cosine k-means over ê.

        Args:
            descriptions: C lists of sentences, in class order.
            generator: torch.Generator (CPU) of the k-means initialisation.

        Returns:
            bool: whether G was fitted now.
        """
        device = self.centres.device
        flat = [sentence for sentences in descriptions for sentence in sentences]
        ids = self.tokenizer(flat).to(device)
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            features = torch.cat([self.encode_sentences(chunk).float() for chunk in ids.split(SENTENCES_PER_PASS)])
        means = torch.stack([part.mean(dim=0) for part in features.split([len(s) for s in descriptions])])
        self.description_targets = F.normalize(means, dim=-1)
        if self.centres_fitted():
            return False
        if len(descriptions) < self.n_clusters:
            raise ConfigError(
                f"TRAINER.TAC.N_CLUSTERS is {self.n_clusters}, but there are only {len(descriptions)} training "
                "classes to cluster; use at most that many clusters."
            )
        with torch.no_grad():
            self.centres.copy_(cosine_kmeans(self.description_targets.cpu(), self.n_clusters, generator).to(device))
        return True

    def compute_text_features(self):
        """t [C, E] (not normalised)."""
        g_t = self.text_map(self.centres)
        prefix, suffix = self.token_prefix, self.token_suffix
        classes = prefix.shape[0]
        middle = torch.cat([g_t.to(prefix.dtype), self.ctx.to(prefix.dtype)]).expand(classes, -1, -1)
        embeddings = torch.cat([prefix, middle, suffix], dim=1)
        start = self.tokenizer.start_tokens
        plan = Plan(layers={index: ReplaceTokens(torch.cat([g_t, prompts.to(g_t.dtype)]), at=start)
                            for index, prompts in enumerate(self.text_prompts, start=1)})
        return self.clip.text(embeddings=embeddings, eot=self.eot, plan=plan).features

    def vision_plan(self):
        """Image-tower plan: [G_v; V_1] appended before ``ln_pre``, [G_v; V_l] replacing the
        last K + n_v tokens at block l-1, the patch mask in every block."""
        g_v = self.vision_map(self.centres)
        tokens = [torch.cat([g_v, prompts.to(g_v.dtype)]) for prompts in self.vision_prompts]
        count = self.n_clusters + self.n_vision
        layers = {index: ReplaceTokens(layer_tokens, at=-count)
                  for index, layer_tokens in enumerate(tokens[1:], start=1)}
        masks = {index: self.patch_mask for index in range(self.clip.visual.num_layers)}
        return Plan(embed=[InsertTokens(tokens[0])], layers=layers, masks=masks)

    def image_features(self, images):
        """f̂ [B, E]: normalised, after the dropout (active in training mode)."""
        features = self.clip.encode_image(images, self.vision_plan())
        return F.normalize(self.dropout(features), dim=-1)

    def forward(self, images):
        return self.cosine_logits(self.image_features(images), self.class_text_features())

    def loss(self, inputs, labels):
        """(total, logits [V B, C], {"ce", "text_l1", "image_l1"}).

        Args:
            inputs: (views [V B, 3, H, W] view-major, originals x_0 [B, 3, H, W]).
            labels: [V B], the B labels repeated for each view.
        """
        if self.description_targets is None:
            raise RuntimeError("TAC's description embeddings are not set: call fit_descriptions() before training.")
        images, originals = inputs
        text = self.class_text_features()
        image = self.image_features(images)
        logits = self.cosine_logits(image, text)
        with torch.no_grad():
            reference = F.normalize(self.dropout(self.clip.encode_image_plain(originals)), dim=-1)
        reference = reference.repeat(images.shape[0] // originals.shape[0], 1)
        ce = F.cross_entropy(logits, labels)
        text_l1 = F.l1_loss(text, self.description_targets.to(text))
        image_l1 = F.l1_loss(image, reference.to(image.dtype))
        total = ce + self.weights["text"] * text_l1 + self.weights["image"] * image_l1
        return total, logits, {"ce": ce.detach(), "text_l1": text_l1.detach(), "image_l1": image_l1.detach()}


def _rename_reference_keys(module, state_dict, prefix, *args):
    """Load-state-dict pre-hook: upstream TAC checkpoint names -> ours (``_REFERENCE_NAMES``)."""
    for key in [key for key in state_dict if key.startswith(prefix)]:
        local = key[len(prefix):]
        for theirs, ours in _REFERENCE_NAMES:
            if local == theirs or (theirs.endswith(".") and local.startswith(theirs)):
                state_dict[prefix + ours + local[len(theirs):]] = state_dict.pop(key)
                break


def check_tac_config(cfg):
    """check_cfg of TAC: precision, depths and sizes against the backbone, weights, RETURN_IMG0."""
    node, backbone = cfg.TRAINER.TAC, cfg.MODEL.BACKBONE.NAME
    vision_layers, text_layers = tower_depths(backbone)
    check_prompt_depth("TRAINER.TAC.PROMPT_DEPTH_TEXT", node.PROMPT_DEPTH_TEXT, text_layers, 1, "text", backbone)
    check_prompt_depth("TRAINER.TAC.PROMPT_DEPTH_VISION", node.PROMPT_DEPTH_VISION, vision_layers, 1, "image", backbone)
    for key in ("N_CTX_TEXT", "N_CTX_VISION", "N_CLUSTERS"):
        check_range(f"TRAINER.TAC.{key}", node[key], minimum=1)
    for key in ("TEXT_LOSS_WEIGHT", "IMAGE_LOSS_WEIGHT"):
        check_range(f"TRAINER.TAC.{key}", node[key], minimum=0)
    check_range("TRAINER.TAC.DROPOUT", node.DROPOUT, minimum=0.0, maximum=0.99)
    if not cfg.DATALOADER.RETURN_IMG0:
        raise ConfigError(
            "TAC's image consistency term compares with the frozen CLIP features of the un-augmented image: "
            "set DATALOADER.RETURN_IMG0 True (the TAC configs do)."
        )


def descriptions_folder(cfg):
    """TRAINER.TAC.DESCRIPTIONS, or DATASET.ROOT/descriptions when it is empty."""
    folder = cfg.TRAINER.TAC.DESCRIPTIONS
    return os.path.expanduser(folder or os.path.join(cfg.DATASET.ROOT, "descriptions"))


def fit_stand_in_descriptions(trainer):
    """The cost benchmark's ``before_train`` step (its case's ``after_build``), with one description per
    stand-in class ("a photo of a class number i.")."""
    descriptions = [[f"a photo of a {name}."] for name in trainer.classnames]
    trainer.model.fit_descriptions(descriptions, torch.Generator().manual_seed(0))


@TRAINER_REGISTRY.register()
class TAC(ClipTrainer):
    """TAC trainer; the whole model is registered (as upstream) under "VLPromptLearner"."""

    # The step encodes the 4 augmented views of each image and the un-augmented image.
    benchmark_cases = (Case("TAC/basetonovel.yaml", TRAIN, after_build=fit_stand_in_descriptions),)

    vit_required_for = "cluster and prompt tokens"

    def check_cfg(self, cfg):
        check_tac_config(cfg)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = TACCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.TAC).to(self.device)
        self.register_learner("VLPromptLearner", self.model)
        self.weight_average = GaussianPromptAggregation(np.full(self.max_epoch, 1.0 / self.max_epoch))

    @classmethod
    def preflight(cls, cfg, training, model_dir):
        """A training run's descriptions file must exist and be readable (its classes are checked
        once the class names are known, before training)."""
        notes = super().preflight(cfg, training, model_dir)
        if training:
            check_descriptions_file(descriptions_folder(cfg), cfg.DATASET.NAME)
        return notes

    def before_train(self):
        super().before_train()  # resumes first: a resumed run keeps its centres
        folder, dataset = descriptions_folder(self.cfg), self.cfg.DATASET.NAME
        descriptions = read_class_descriptions(folder, dataset, self.classnames)
        try:
            fitted = self.model.fit_descriptions(descriptions, torch.Generator().manual_seed(self.cfg.SEED))
        except PromptTooLongError as error:
            raise DescriptionsError(f"{descriptions_file(folder, dataset)}: {error}") from None
        print(f"TAC: {len(descriptions)} classes' descriptions from {descriptions_file(folder, dataset)}; cluster "
              f"centres {'fitted by k-means' if fitted else 'kept from the checkpoint'}")

    def parse_batch_train(self, batch):
        """((views [V B, 3, H, W] view-major, originals [B, 3, H, W]), labels [V B])."""
        views = batch["img"] if isinstance(batch["img"], (list, tuple)) else [batch["img"]]
        labels = batch["label"].repeat(len(views))
        return (torch.cat(views).to(self.device), batch["img0"].to(self.device)), labels.to(self.device)

    def learnable_tensors(self):
        return {name: param for name, param in self.model.named_parameters() if param.requires_grad}

    def after_epoch(self):
        self.weight_average.add(self.epoch, self.learnable_tensors())
        if self.epoch + 1 == self.max_epoch:
            self.use_average()
        super().after_epoch()

    def use_average(self):
        """Replace the learnable tensors by their uniform average over the epochs (before the final save)."""
        missing = sorted(set(range(self.max_epoch)) - set(self.weight_average.epochs))
        if missing:
            print(f"Warning: the weight average has no weights of epochs {[e + 1 for e in missing]} (resumed from a "
                  "checkpoint without its running sum); averaging the epochs it has")
        print("Using the epoch-averaged weights for final inference...")
        scale = self.max_epoch / len(self.weight_average.epochs)
        with torch.no_grad():
            for name, param in self.learnable_tensors().items():
                param.copy_(self.weight_average.total[name] * scale)

    def test(self, split=None):
        if not self.model.centres_fitted():
            raise RuntimeError(
                "TAC's cluster centres come from training (k-means over the training classes' descriptions) and "
                "this model has none: evaluate a trained TAC model (--eval-only --model-dir DIR).")
        return super().test(split)

    def get_trainer_state(self):
        state = super().get_trainer_state()
        state["weight_average"] = self.weight_average.state_dict()
        return state

    def set_trainer_state(self, state):
        super().set_trainer_state(state)
        if "weight_average" in state:
            self.weight_average.load_state_dict(state["weight_average"])

    def get_class_dependent_keys(self, name):
        # Upstream checkpoints also hold the class-dependent embeddings.
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
