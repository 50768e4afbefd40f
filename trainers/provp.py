"""ProVP-Ref: Progressive Visual Prompt learning with contrastive feature re-formation
(Xu et al., IJCV 2024; DeAR's Table 2 labels it CVPR2024).

Only the image tower is prompted; the text tower and all CLIP weights stay frozen.

Prompts P ∈ R^{J×N×D_v} (J = PROMPT_DEPTH = 12 layers, N = N_PROMPTS = 16 tokens, D_v = 768 for
ViT-B/16), drawn from U(−v, v) with v = sqrt(6 / (3·p² + D_v)) and p = INIT_PATCH_SIZE = 14 (the
Xavier bound of a p×p patch embedding; upstream hard-codes p = 14 although ViT-B/16's patches
are 16 pixels: the constant is kept, and configurable).

Image tower (runner plan, 0-based block l, x^{(l)} the input of block l after ``ln_pre``):

* block 0: x ← [x_CLS; P_0; x_patches] when N > 4 (P_0 inserted after CLS, after ``ln_pre``,
  without positional embedding); with N <= 4 nothing is inserted (upstream's rule);
* blocks 1..J−1, progressive: positions 1..N are re-mixed,
  x_{1..N} ← α·x_{1..N} + (1−α)·P_l, α = ALPHA = 0.01, where x_{1..N} is the previous block's
  output at those positions; the prompt outputs are thus carried from layer to layer;
* blocks J..: nothing; the prompts are never removed; the image feature is the class token's.

With N <= 4 the re-mixed positions 1..N are the first N patch tokens and P_0 is unused, as
upstream.

Logits z = s·f̂_p·t̂ᵀ [B, C], s = exp(logit_scale) (100), t the frozen CLIP text features of
ProGrad's per-dataset template (``vlprompt.methods.prograd_templates``, equal to upstream's
table; other datasets use their own ``template``), computed once.

Loss (per batch of B images):

    L = CE(z, y) + λ·CE(f̂_p·f̂_CLIPᵀ, arange(B))

the re-formation term being InfoNCE between the prompted features f̂_p [B, E] and frozen CLIP's
features f̂_CLIP [B, E] of the same (augmented) images, without temperature; λ = REF_WEIGHT = 1
(0: ProVP without re-formation, upstream's OPTIM.USE_REF False).

Inference is the same for every evaluation scope (base, new, source, target): the prompted image
feature against the class list's frozen text features (no role rule).

ViT-B/16: 12·16·768 = 147,456 learnable parameters.

Verified by reading MCG-NJU/ProVP @ 837b8fb3: ProVP/trainers/provp.py (``PromptLearner``: one
[12, N, 768] tensor ``prompt_embeddings``, uniform bound with patch_size = 14, dropout 0.0;
``CUSTOM_TEMPLATES``; ``ReformatLoss``: CE(p_feat @ clip_feat.t(), arange(B)) on normalised
features, weight ``Lam`` hard-coded 1.0 (LOSS.LAMBDA is not read); the zero-shot CLIP is a second
fp32 copy encoding the same augmented batch), ProVP/clip/model.py (``ResidualAttentionBlock``:
at layer_id 0 the concatenation after CLS only if N > 4, at layer_id >= 1 the in-place re-mix
``x[1:N+1] = x[1:N+1]*0.01 + P*(1-0.01)`` of the block input, i.e. of the previous block's
output), ProVP/configs/trainers/ProVP/vit_b16_b2n_ep100.yaml (the recipe) and its Dassl fork.
Upstream's "amp" branch of ``forward_backward`` cannot run (it unpacks three outputs of a model
that returns two, and passes the ProGrad loss's arguments to ``ReformatLoss``); its fp16/fp32
branch is the method, and ours runs that at every precision.
Upstream evaluates on the test split after every epoch and reports the base classes with the
best test epoch (``after_epoch`` saves model-best by test accuracy, ``after_train`` loads it),
the novel classes with epoch 100; this project evaluates the last epoch for both.
Compared by running MCG-NJU/ProVP @ 837b8fb3 (its ``mProVP``, zero-shot ``CLIP`` and
``ReformatLoss`` in fp32, with its own Dassl fork) on a seeded random ViT-B/16, P at 10x its init
std, 2 images and 3 classes (OxfordPets template): logits, CE, re-formation term, total loss and the
per-token norms of ∂loss/∂P agree (relative max differences in docs/fidelity.md;
tools/official_equivalence.py ProVP, tests/fixtures/official/provp.json,
tests/test_fidelity.py). tests/test_provp.py checks the equations above
independently with open_clip's blocks.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import InsertTokens, MapTokens, Plan, PromptedCLIP, fill_template
from vlprompt.clip import check_prompt_sizes
from vlprompt.clip.templates import dataset_template
from vlprompt.config import check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule
from vlprompt.methods.prograd_templates import PROGRAD_TEMPLATES

# ProGrad's table is upstream's; a dataset outside it takes its own template.
TEMPLATE_RULE = DatasetRule("ProVP's template", PROGRAD_TEMPLATES, default="", option=False, fallback="template",
                            source="vlprompt.methods.prograd_templates.PROGRAD_TEMPLATES")
# Upstream inserts the first layer's prompts only when there are more than this many.
MAX_TOKENS_WITHOUT_INSERTION = 4


@register_cfg_extension
def add_provp_config(cfg):
    cfg.TRAINER.PROVP = CN()
    cfg.TRAINER.PROVP.N_PROMPTS = 16  # N: prompt tokens per layer (upstream TRAINER.COOP.N_CTX)
    cfg.TRAINER.PROVP.PROMPT_DEPTH = 12  # J: image layers with prompts (upstream: 12, fixed)
    cfg.TRAINER.PROVP.ALPHA = 0.01  # α: share of the previous layer's prompt output kept
    cfg.TRAINER.PROVP.INIT_PATCH_SIZE = 14  # p of the uniform bound sqrt(6 / (3 p² + D_v)) (upstream: 14, fixed)
    cfg.TRAINER.PROVP.REF_WEIGHT = 1.0  # λ of the contrastive re-formation term (0: ProVP without it)
    cfg.TRAINER.PROVP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA


def uniform_bound(patch_size, width):
    """v = sqrt(6 / (3·p² + D)): the half-width of the prompts' uniform initialisation."""
    return math.sqrt(6.0 / (3 * patch_size * patch_size + width))


def provp_template(dataset_name, dataset):
    """ProVP's sentence template: ``PROGRAD_TEMPLATES`` (upstream's table), else the dataset's own."""
    return TEMPLATE_RULE.lookup(dataset_name, own=dataset_template(dataset))


class ProgressivePrompts(nn.Module):
    """The learnable prompts P [J, N, D_v] and the image-tower plan that uses them.

    Args:
        depth: J. n_tokens: N. width: D_v. alpha: α. init_patch_size: p of the uniform bound.

    Attributes:
        prompt_embeddings: P [J, N, D_v] ~ U(−v, v) (upstream's name, so its checkpoints load).
    """

    def __init__(self, depth, n_tokens, width, alpha, init_patch_size):
        super().__init__()
        self.alpha = alpha
        bound = uniform_bound(init_patch_size, width)
        self.prompt_embeddings = nn.Parameter(torch.empty(depth, n_tokens, width).uniform_(-bound, bound))

    @property
    def n_tokens(self):
        return self.prompt_embeddings.shape[1]

    def plan(self, at=1):
        """Plan: P_0 inserted after the prefix tokens (``at``: CLIP's class token, so 1; 0 on towers
        without one) at block 0 (if N > 4), positions at..at+N-1 re-mixed with P_l at blocks 1..J−1."""
        prompts = self.prompt_embeddings
        layers = {}
        if self.n_tokens > MAX_TOKENS_WITHOUT_INSERTION:
            layers[0] = InsertTokens(prompts[0], at=at)
        for index in range(1, prompts.shape[0]):
            layers[index] = MapTokens(self._remix(prompts[index], at))
        return Plan(layers=layers)

    def _remix(self, prompt, at):
        """x [B, L, D] -> x with x_{at..at+N-1} := α·x_{at..at+N-1} + (1−α)·prompt ([N, D])."""
        alpha, n = self.alpha, prompt.shape[0]

        def remix(x):
            mixed = alpha * x[:, at:at + n] + (1 - alpha) * prompt.to(x.dtype)
            return torch.cat([x[:, :at], mixed, x[:, at + n:]], dim=1)

        return remix


class ProVPCLIP(PromptedCLIP):
    """Frozen CLIP with progressive visual prompts and a fixed text classifier.

    Args:
        clip: CLIPRunner (ViT image tower). tokenizer: Tokenizer. classnames: C names.
        template: sentence template with "{}". node: cfg.TRAINER.PROVP.

    Attributes:
        prompt_learner: ProgressivePrompts.
        ref_weight: λ.
        class_features: buffer [C, E], frozen text features of the template sentences (rebuilt
            with the class list, never saved).
    """

    def __init__(self, clip, tokenizer, classnames, template, node):
        super().__init__(clip)
        self.prompt_learner = ProgressivePrompts(
            node.PROMPT_DEPTH, node.N_PROMPTS, clip.visual.width, node.ALPHA, node.INIT_PATCH_SIZE
        )
        self.ref_weight = node.REF_WEIGHT
        sentences = [fill_template(template, name) for name in classnames]
        print(f"ProVP: fixed prompts {sentences[:3]}...; {node.N_PROMPTS} tokens in {node.PROMPT_DEPTH} image layers, "
              f"α {node.ALPHA}, λ {node.REF_WEIGHT}")
        with torch.no_grad():
            features = self.encode_sentences(tokenizer(sentences).to(clip.logit_scale.device))
        self.register_buffer("class_features", features, persistent=False)

    def compute_text_features(self):
        return self.class_features

    def encode_image(self, images):
        """f̂_p [B, E]: normalised prompted image features of images [B, 3, H, W]."""
        plan = self.prompt_learner.plan(self.clip.visual.layout.prefix_tokens)
        return F.normalize(self.clip.encode_image(images, plan), dim=-1)

    def forward(self, images):
        return self.cosine_logits(self.encode_image(images), self.class_text_features())

    def loss(self, images, labels):
        """(CE + λ·re-formation, logits [B, C], {"xe_loss", "ref_loss"})."""
        features = self.encode_image(images)
        logits = self.cosine_logits(features, self.class_text_features().to(features.dtype))
        xe_loss = F.cross_entropy(logits, labels)
        terms = {"xe_loss": xe_loss.detach()}
        if self.ref_weight == 0:
            return xe_loss, logits, terms
        ref_loss = self.reformation_loss(features, images)
        terms["ref_loss"] = ref_loss.detach()
        return xe_loss + self.ref_weight * ref_loss, logits, terms

    def reformation_loss(self, features, images):
        """CE(f̂_p·f̂_CLIPᵀ, arange(B)): InfoNCE of f̂_p [B, E] against frozen CLIP's features of
        the same images [B, 3, H, W], without temperature."""
        with torch.no_grad():
            reference = F.normalize(self.clip.encode_image_plain(images), dim=-1)
        similarity = features @ reference.to(features.dtype).t()
        return F.cross_entropy(similarity, torch.arange(len(images), device=similarity.device))


def check_provp_config(cfg):
    node = cfg.TRAINER.PROVP
    check_prompt_sizes(cfg, "PROVP", vision=("PROMPT_DEPTH", "N_PROMPTS"))
    check_range("TRAINER.PROVP.ALPHA", node.ALPHA, minimum=0.0, maximum=1.0)
    check_range("TRAINER.PROVP.INIT_PATCH_SIZE", node.INIT_PATCH_SIZE, minimum=1)
    check_range("TRAINER.PROVP.REF_WEIGHT", node.REF_WEIGHT, minimum=0.0)


@TRAINER_REGISTRY.register()
class ProVP(ClipTrainer):
    """ProVP-Ref trainer; the checkpointed module ("prompt_learner") holds P."""

    benchmark_cases = (Case("ProVP/vit_b16_b2n_ep100.yaml", TRAIN),)

    vit_required_for = "prompts of the image tower's blocks"

    def check_cfg(self, cfg):
        check_provp_config(cfg)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        template = provp_template(self.cfg.DATASET.NAME, self.dm.dataset)
        self.model = ProVPCLIP(clip, tokenizer, self.classnames, template, self.cfg.TRAINER.PROVP).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)
