"""MMRL: Multi-Modal Representation Learning (Guo et al., CVPR 2025).

Frozen CLIP plus a shared representation space read by both towers:

* R ∈ R^{K×d_r} (K = N_REP_TOKENS = 5, d_r = REP_DIM = 512; N(0, 0.02));
* for each representation layer l ∈ REP_LAYERS (1-based, 6..12 for ViT-B/16) two Linear maps
  with bias, P_v^l: d_r -> D_v and P_t^l: d_r -> D_t; the copies of each start as deep copies
  of ONE random Linear (identical at initialisation);
* ``proj_rep`` [D_v, E], initialised as D_v^-0.5·randn (not copied from CLIP's ``proj``).

Towers (runner plans, 0-based block b = l - 1):
* image: at the input of the first representation block insert P_v(R) [K, D_v] after CLS,
  [CLS; rep(K); patches]; the later representation blocks replace those K slots;
* text: the same at position 1 (after BOT): the sequence grows by K (77 -> 82 for ViT-B/16, no
  truncation), the inserted tokens get no positional embedding (they enter mid-tower), the
  causal mask covers the grown sequence and the pooled end-of-text position moves by K.

Features: f_cls = LN_post(x_0)·proj (CLIP's frozen projection), f_rep = mean_k LN_post(x_k)·proj_rep
over the K representation tokens, t_c the class sentence (the dataset's fixed hand-written
template) through the text tower with the representation tokens.
Logits z_c = 100·f̂_cls·t̂ᵀ, z_r = 100·f̂_rep·t̂ᵀ (scale 100 fixed, as upstream).

Loss: α·CE(z_c) + (1−α)·CE(z_r) + λ·(1 − mean_b cos(f_cls, f_cls^CLIP))
      + λ·(1 − mean_c cos(t_c, t_c^CLIP)),
α = ALPHA = 0.7, λ = REG_WEIGHT, the references from frozen CLIP with the same sentences.

Inference (TRAINER.MMRL.INFERENCE, a ScopeRule): ``fusion`` α·z_c + (1−α)·z_r for base and
source, ``cls`` z_c for new and target (z_r is never used on classes it was not trained on).

Per-dataset settings (upstream trainers/config.py, its B2N task): REG_WEIGHT and REP_DIM ``auto``
(DatasetRules) mean "from DATASET_SETTINGS by DATASET.NAME"; explicit values win (upstream merges
the table before command-line options). A dataset missing from the table is a ConfigError naming
the key to set (upstream silently keeps its config's λ 1.0 there).

ViT-B/16 (K 5, d_r 512, 7 layers): 2,560 + 7·(512·768 + 768) + 7·(512·512 + 512) + 768·512
= 4,992,256 learnable parameters.

Verified by reading the official code (yunncheng/MMRL @ 27d8821f): clip/model_mmrl.py
(``ResidualAttentionBlock``: layers 1-based, insertion after CLS/BOT at REP_LAYERS[0] and
replacement at the later ones in both towers, causal mask rebuilt for the grown text length;
``VisionTransformer``: ``proj_rep`` = scale·randn(width, output_dim), f_rep = mean of
ln_post(x[:, 1:1+K]) @ proj_rep), trainers/mmrl.py (``_get_clones`` deep copies, R std 0.02,
logits 100·f̂·t̂ᵀ, fusion α·z_c + (1−α)·z_r, the loss of ``MMRL_Loss``, the text pooled at
argmax + K, CUSTOM_TEMPLATES, equal to the datasets' ``template`` attributes here),
trainers/config.py (λ per dataset, EuroSAT REP_DIM 2048).
Side by side with the official code (tools/official_equivalence.py MMRL, vlprompt_app/fidelity/methods/mmrl.py,
tests/test_fidelity.py): yunncheng/MMRL @ 27d8821f's CustomCLIP and MMRL_Loss on a
seeded random ViT-B/16 (Dassl.pytorch @ c61a1b57), R, each of the 7 maps per tower and proj_rep
drawn at 10x their init std, 2 images, 3 classes: the fused base-scope logits, the class-token
logits, the representation logits and the training loss with the λ regularisers agree (relative
max differences in docs/fidelity.md; tokens one block early, or two layers' maps swapped, fail).
Not done yet: the cross-dataset / domain-generalization recipe (ImageNet, batch 32, 1 epoch, no
warm-up, λ 0.2); tests/test_mmrl.py checks the equations above independently with open_clip's blocks.
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import InsertTokens, Plan, PromptedCLIP, ReplaceTokens, fill_template
from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule, ScopeRule

INFERENCE_RULE = ScopeRule("TRAINER.MMRL.INFERENCE", base="fusion", new="cls", source="fusion", target="cls")
LOGIT_SCALE = 100.0
# DATASET.NAME -> the settings upstream's trainers/config.py merges for it (B2N recipe).
DATASET_SETTINGS = {
    "StanfordCars": {"REG_WEIGHT": 7.0, "REP_DIM": 512},
    "FGVCAircraft": {"REG_WEIGHT": 6.0, "REP_DIM": 512},
    "SUN397": {"REG_WEIGHT": 6.0, "REP_DIM": 512},
    "DescribableTextures": {"REG_WEIGHT": 6.0, "REP_DIM": 512},
    "Food101": {"REG_WEIGHT": 5.0, "REP_DIM": 512},
    "OxfordFlowers": {"REG_WEIGHT": 4.0, "REP_DIM": 512},
    "UCF101": {"REG_WEIGHT": 3.0, "REP_DIM": 512},
    "ImageNet": {"REG_WEIGHT": 0.5, "REP_DIM": 512},
    "Caltech101": {"REG_WEIGHT": 0.5, "REP_DIM": 512},
    "OxfordPets": {"REG_WEIGHT": 0.2, "REP_DIM": 512},
    "EuroSAT": {"REG_WEIGHT": 0.01, "REP_DIM": 2048},
}
DATASET_RULES = {
    key: DatasetRule(f"TRAINER.MMRL.{key}", {name: row[key] for name, row in DATASET_SETTINGS.items()},
                     source="trainers.mmrl.DATASET_SETTINGS")
    for key in ("REG_WEIGHT", "REP_DIM")
}


@register_cfg_extension
def add_mmrl_config(cfg):
    cfg.TRAINER.MMRL = CN()
    cfg.TRAINER.MMRL.PREC = "amp"  # fp16, fp32, amp or bf16
    cfg.TRAINER.MMRL.N_REP_TOKENS = 5  # K
    cfg.TRAINER.MMRL.REP_LAYERS = [6, 7, 8, 9, 10, 11, 12]  # 1-based, consecutive, both towers
    cfg.TRAINER.MMRL.REP_DIM = "auto"  # d_r; auto: from DATASET_SETTINGS by DATASET.NAME
    cfg.TRAINER.MMRL.REG_WEIGHT = "auto"  # λ; auto: from DATASET_SETTINGS by DATASET.NAME
    cfg.TRAINER.MMRL.ALPHA = 0.7  # α: CE and fusion weight of z_c
    cfg.TRAINER.MMRL.INFERENCE = "auto"  # auto (by evaluation scope), fusion or cls


def dataset_settings(node, dataset):
    """(d_r, λ) of TRAINER.MMRL ``node`` on ``dataset`` (DATASET.NAME), ``auto`` read from DATASET_SETTINGS.

    Raises:
        ConfigError: ``auto`` for a dataset outside the table, d_r < 1 or λ < 0.
    """
    reg_weight = DATASET_RULES["REG_WEIGHT"].resolve(node.REG_WEIGHT, dataset)
    rep_dim = DATASET_RULES["REP_DIM"].resolve(node.REP_DIM, dataset)
    check_range("TRAINER.MMRL.REG_WEIGHT", reg_weight, minimum=0.0)
    check_range("TRAINER.MMRL.REP_DIM", rep_dim, minimum=1)
    return rep_dim, reg_weight


def check_representation_config(key, inference_rule, inference, n_tokens, alpha, layers):
    """The checks MMRL and MMRL++ share, of the values of the node named ``key`` (e.g.
    "TRAINER.MMRL"): INFERENCE, N_REP_TOKENS, ALPHA and REP_LAYERS."""
    inference_rule.check(inference)
    check_range(f"{key}.N_REP_TOKENS", n_tokens, minimum=1)
    check_range(f"{key}.ALPHA", alpha, minimum=0.0, maximum=1.0)
    layers = list(layers)
    if not layers or layers != list(range(layers[0], layers[0] + len(layers))) or layers[0] < 1:
        raise ConfigError(
            f"{key}.REP_LAYERS must be consecutive ascending 1-based layers (e.g. [6, 7, ..., 12]), got {layers}."
        )


def check_mmrl_config(node, dataset):
    check_representation_config("TRAINER.MMRL", INFERENCE_RULE, node.INFERENCE, node.N_REP_TOKENS,
                                node.ALPHA, node.REP_LAYERS)
    dataset_settings(node, dataset)


class SharedRepresentation(nn.Module):
    """R [K, d_r] and its per-layer maps into the towers: the part MMRL and MMRL++ share.

    A subclass gives ``layer_tokens(tower)`` (the mapped tokens [K, D] of each representation
    layer, in order), ``later_edit(tokens)`` (what a later representation layer does with them)
    and ``image_projection(proj)`` ([D_v, E], the projection of f_rep; ``proj`` is CLIP's).
    """

    def __init__(self, n_tokens, rep_dim):
        super().__init__()
        self.rep = nn.Parameter(torch.empty(n_tokens, rep_dim).normal_(std=0.02))

    def plan(self, tower, first_block):
        """Plan of ``tower`` ("visual" or "text"): insert the first layer's tokens [K, D] at
        position 1 at 0-based block ``first_block``, ``later_edit`` at the following blocks."""
        tokens = self.layer_tokens(tower)
        layers = {first_block: InsertTokens(tokens[0], at=1)}
        for i, mapped in enumerate(tokens[1:], start=1):
            layers[first_block + i] = self.later_edit(mapped)
        return Plan(layers=layers)


class RepresentationLearner(SharedRepresentation):
    """MMRL's R [K, d_r], the per-layer maps P_v^l, P_t^l and ``proj_rep`` [D_v, E].

    Attributes:
        rep: R. visual, text: ModuleLists of Linear(d_r, D_v) / Linear(d_r, D_t), one per
            representation layer, deep copies of one random Linear. proj_rep: [D_v, E].
    """

    def __init__(self, n_tokens, rep_dim, num_layers, vision_width, text_width, embed_dim):
        super().__init__(n_tokens, rep_dim)
        visual, text = nn.Linear(rep_dim, vision_width), nn.Linear(rep_dim, text_width)
        self.visual = nn.ModuleList(copy.deepcopy(visual) for _ in range(num_layers))
        self.text = nn.ModuleList(copy.deepcopy(text) for _ in range(num_layers))
        self.proj_rep = nn.Parameter(vision_width ** -0.5 * torch.randn(vision_width, embed_dim))

    def layer_tokens(self, tower):
        """[P^l(R) [K, D] for each representation layer l] of ``tower``."""
        return [linear(self.rep) for linear in getattr(self, tower)]

    def later_edit(self, tokens):
        """A later representation layer replaces positions 1..K with P^l(R)."""
        return ReplaceTokens(tokens, at=1)

    def image_projection(self, proj):
        """``proj_rep``, learned on its own (CLIP's ``proj`` is not used)."""
        return self.proj_rep


class MMRLCLIP(PromptedCLIP):
    """Frozen CLIP with MMRL's representation tokens in both towers.

    Args:
        clip: CLIPRunner (ViT image tower). tokenizer: Tokenizer. classnames: C names.
        template: the dataset's sentence with "{}". node: cfg.TRAINER.MMRL.
        rep_dim: d_r. reg_weight: λ. inference: "fusion" or "cls".

    A variant (MMRL++) overrides ``build_representation`` and the names used in messages
    (``NAME``, ``KEY``: its config node).
    """

    NAME, KEY = "MMRL", "TRAINER.MMRL"

    device_caches = PromptedCLIP.device_caches + ("_frozen_text",)  # frozen-CLIP text targets

    def __init__(self, clip, tokenizer, classnames, template, node, rep_dim, reg_weight, inference):
        super().__init__(clip)
        layers = list(node.REP_LAYERS)
        deepest = min(clip.visual.num_layers, clip.text.num_layers)
        if layers[-1] > deepest:
            raise ConfigError(
                f"{self.KEY}.REP_LAYERS {layers} must lie within both towers (1..{deepest}: "
                f"{clip.visual.num_layers} image and {clip.text.num_layers} text blocks)."
            )
        self.first_block = layers[0] - 1
        self.n_tokens, self.alpha = node.N_REP_TOKENS, node.ALPHA
        self.reg_weight, self.inference = reg_weight, inference
        self.representation = self.build_representation(node, rep_dim, len(layers))
        sentences = [fill_template(template, name) for name in classnames]
        print(f"{self.NAME} sentences: {sentences[:3]}...; representation layers (1-based) {layers}, "
              f"K {self.n_tokens}, d_r {rep_dim}, λ {reg_weight}, inference {inference}")
        self.register_buffer("token_ids", tokenizer(sentences), persistent=False)
        self._frozen_text = None

    def build_representation(self, node, rep_dim, num_layers):
        """MMRL's :class:`RepresentationLearner` for ``num_layers`` representation layers."""
        clip = self.clip
        return RepresentationLearner(
            node.N_REP_TOKENS, rep_dim, num_layers, clip.visual.width, clip.text.width, clip.visual.output_dim
        )

    def compute_text_features(self):
        """t [C, E] (not normalised), the sentences with the representation tokens."""
        return self.clip.text(self.token_ids, self.representation.plan("text", self.first_block)).features

    def frozen_text_features(self):
        """t^CLIP [C, E] of frozen CLIP, the same sentences (a constant, cached)."""
        if self._frozen_text is None:
            with torch.no_grad():
                self._frozen_text = self.clip.text(self.token_ids).features.float()
        return self._frozen_text

    def encode_image(self, images, frozen=False):
        """(f_cls [B, E], f_rep [B, E], f_cls^CLIP [B, E] with ``frozen`` else None), not normalised."""
        visual = self.clip.visual
        hidden = visual.run_prefix(images, self.first_block)
        rows = list(range(self.n_tokens + 1))
        plan = self.representation.plan("visual", self.first_block)
        out = visual(hidden=hidden, start=self.first_block, plan=plan, rows=rows)
        proj_rep = self.representation.image_projection(visual.proj).to(out.tokens.dtype)
        f_rep = visual.ln_post(out.tokens[:, 1:1 + self.n_tokens]) @ proj_rep
        reference = None
        if frozen:
            with torch.no_grad():
                reference = visual(hidden=hidden, start=self.first_block, rows=[0]).features
        return out.features, f_rep.mean(1), reference

    def logits(self, f_cls, f_rep, text_features):
        """(z_c, z_r) [B, C] each, from unnormalised image features and normalised text [C, E]."""
        text_features = text_features.to(f_cls.dtype)
        z_c = LOGIT_SCALE * F.normalize(f_cls, dim=-1) @ text_features.t()
        z_r = LOGIT_SCALE * F.normalize(f_rep, dim=-1) @ text_features.t()
        return z_c, z_r

    def forward(self, images):
        f_cls, f_rep, _ = self.encode_image(images)
        z_c, z_r = self.logits(f_cls, f_rep, self.class_text_features())
        return z_c if self.inference == "cls" else self.alpha * z_c + (1 - self.alpha) * z_r

    def loss(self, images, labels):
        """(total, fused logits [B, C], {"ce_cls", "ce_rep", "reg_image", "reg_text"})."""
        f_cls, f_rep, f_clip = self.encode_image(images, frozen=True)
        text = self.compute_text_features()
        z_c, z_r = self.logits(f_cls, f_rep, F.normalize(text, dim=-1))
        ce_cls, ce_rep = F.cross_entropy(z_c, labels), F.cross_entropy(z_r, labels)
        reg_image = 1 - F.cosine_similarity(f_cls.float(), f_clip.float(), dim=-1).mean()
        reg_text = 1 - F.cosine_similarity(text.float(), self.frozen_text_features(), dim=-1).mean()
        total = self.alpha * ce_cls + (1 - self.alpha) * ce_rep + self.reg_weight * (reg_image + reg_text)
        fused = self.alpha * z_c + (1 - self.alpha) * z_r
        terms = {"ce_cls": ce_cls.detach(), "ce_rep": ce_rep.detach(),
                 "reg_image": reg_image.detach(), "reg_text": reg_text.detach()}
        return total, fused, terms


@TRAINER_REGISTRY.register()
class MMRL(ClipTrainer):
    """MMRL trainer; the checkpointed module ("representation") holds R, P_v, P_t and proj_rep.

    A variant (MMRL++) sets ``model_class`` and ``inference_rule`` and overrides ``check_cfg``
    and ``model_settings``.
    """

    # λ and the representation width are per dataset: the benchmark's stand-in classes take the Pets ones.
    benchmark_cases = (Case("MMRL/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),)

    model_class = MMRLCLIP
    inference_rule = INFERENCE_RULE
    vit_required_for = "representation tokens"

    def check_cfg(self, cfg):
        check_mmrl_config(cfg.TRAINER.MMRL, cfg.DATASET.NAME)

    def model_settings(self):
        """(node, d_r, λ) for ``model_class``, the per-dataset values resolved (and logged)."""
        node, dataset = self.cfg.TRAINER.MMRL, self.cfg.DATASET.NAME
        settings = dataset_settings(node, dataset)
        print(DATASET_RULES["REP_DIM"].describe(node.REP_DIM, dataset))
        print(DATASET_RULES["REG_WEIGHT"].describe(node.REG_WEIGHT, dataset))
        return (node, *settings)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node, rep_dim, reg_weight = self.model_settings()
        template = self.dataset_template()
        print(self.inference_rule.describe(node.INFERENCE, self.eval_scope))
        self.model = self.model_class(
            clip, tokenizer, self.classnames, template, node, rep_dim, reg_weight,
            self.inference_rule.resolve(node.INFERENCE, self.eval_scope),
        ).to(self.device)
        self.register_learner("representation", self.model.representation)
