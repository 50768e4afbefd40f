"""The representation-tokens family: MMRL's shared representation space read by both towers
(MMRL, CVPR 2025).

A learnable R [K, d_r] is mapped into each tower at the representation layers, inserted after
CLS/BOT at the first and edited at the later ones (``SharedRepresentation``; MMRL's maps in
``RepresentationLearner``); ``MMRLCLIP`` gives the class-token and representation logits, their
fusion and the loss with the regularisers towards frozen CLIP; ``RepresentationTokensTrainer``
builds it from a node's per-dataset settings; ``check_representation_config`` checks what the
nodes share. Introduced by MMRL (``trainers/mmrl.py``, whose docstring gives the equations);
MMRL++ replaces the maps and the later layers' edit.
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from vlprompt.clip import InsertTokens, Plan, PromptedCLIP, ReplaceTokens, fill_template
from vlprompt.config import ConfigError, check_range
from vlprompt.engine import ClipTrainer

__all__ = [
    "LOGIT_SCALE", "check_representation_config", "SharedRepresentation", "RepresentationLearner", "MMRLCLIP",
    "RepresentationTokensTrainer",
]


LOGIT_SCALE = 100.0


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


class SharedRepresentation(nn.Module):
    """R [K, d_r] and its per-layer maps into the towers: the part MMRL and MMRL++ share.

    A subclass gives ``layer_tokens(tower)`` (the mapped tokens [K, D] of each representation
    layer, in order), ``later_edit(tokens, at)`` (what a later representation layer does with them
    at positions at..at+K-1) and ``image_projection(proj)`` ([D', E], the projection of f_rep;
    ``proj`` is the image head's, ``VisionTower.projection_or_identity``).
    """

    def __init__(self, n_tokens, rep_dim):
        super().__init__()
        self.rep = nn.Parameter(torch.empty(n_tokens, rep_dim).normal_(std=0.02))

    def plan(self, tower, first_block, at):
        """Plan of ``tower`` ("visual" or "text"): insert the first layer's tokens [K, D] at
        position ``at`` (after the class token or the start-of-text token; where a tower has none,
        first) at 0-based block ``first_block``, ``later_edit`` at the following blocks."""
        tokens = self.layer_tokens(tower)
        layers = {first_block: InsertTokens(tokens[0], at=at)}
        for i, mapped in enumerate(tokens[1:], start=1):
            layers[first_block + i] = self.later_edit(mapped, at)
        return Plan(layers=layers)


class RepresentationLearner(SharedRepresentation):
    """MMRL's R [K, d_r], the per-layer maps P_v^l, P_t^l and ``proj_rep`` [D', E].

    Attributes:
        rep: R. visual, text: ModuleLists of Linear(d_r, D_v) / Linear(d_r, D_t), one per
            representation layer, deep copies of one random Linear. proj_rep: [D', E] (D' what the
            image head's final projection reads: D_v for CLIP).
    """

    def __init__(self, n_tokens, rep_dim, num_layers, vision_width, text_width, embed_dim, projection_width=None):
        super().__init__(n_tokens, rep_dim)
        visual, text = nn.Linear(rep_dim, vision_width), nn.Linear(rep_dim, text_width)
        self.visual = nn.ModuleList(copy.deepcopy(visual) for _ in range(num_layers))
        self.text = nn.ModuleList(copy.deepcopy(text) for _ in range(num_layers))
        projection_width = projection_width or vision_width
        self.proj_rep = nn.Parameter(projection_width ** -0.5 * torch.randn(projection_width, embed_dim))

    def layer_tokens(self, tower):
        """[P^l(R) [K, D] for each representation layer l] of ``tower``."""
        return [linear(self.rep) for linear in getattr(self, tower)]

    def later_edit(self, tokens, at):
        """A later representation layer replaces positions at..at+K-1 with P^l(R)."""
        return ReplaceTokens(tokens, at=at)

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
        self.text_at = tokenizer.start_tokens  # the tokens go after the start-of-text token
        self._frozen_text = None

    def build_representation(self, node, rep_dim, num_layers):
        """MMRL's :class:`RepresentationLearner` for ``num_layers`` representation layers."""
        clip = self.clip
        return RepresentationLearner(
            node.N_REP_TOKENS, rep_dim, num_layers, clip.visual.width, clip.text.width, clip.visual.output_dim,
            clip.visual.projection_input_dim,
        )

    def compute_text_features(self):
        """t [C, E] (not normalised), the sentences with the representation tokens."""
        plan = self.representation.plan("text", self.first_block, self.text_at)
        return self.clip.text(self.token_ids, plan).features

    def frozen_text_features(self):
        """t^CLIP [C, E] of frozen CLIP, the same sentences (a constant, cached)."""
        if self._frozen_text is None:
            with torch.no_grad():
                self._frozen_text = self.clip.text(self.token_ids).features.float()
        return self._frozen_text

    def encode_image(self, images, frozen=False):
        """(f_cls [B, E], f_rep [B, E], f_cls^CLIP [B, E] with ``frozen`` else None), not normalised."""
        visual = self.clip.visual
        at = visual.layout.prefix_tokens  # after the class token (first on towers without one)
        hidden = visual.run_prefix(images, self.first_block)
        plan = self.representation.plan("visual", self.first_block, at)
        out = visual(hidden=hidden, start=self.first_block, plan=plan, rows=range(at, at + self.n_tokens))
        proj_rep = self.representation.image_projection(visual.projection_or_identity()).to(out.tokens.dtype)
        f_rep = visual.token_features(out.tokens, proj_rep)
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


class RepresentationTokensTrainer(ClipTrainer):
    """MMRL's trainer: builds ``model_class`` (MMRLCLIP or a variant) with the per-dataset settings
    of ``model_settings`` and the inference of ``inference_rule``; the checkpointed module
    ("representation") holds R and its maps.

    A subclass sets ``model_class`` and ``inference_rule`` (a ScopeRule of its node's INFERENCE)
    and gives ``check_cfg`` and ``model_settings`` -> (node, d_r, λ).
    """

    vit_required_for = "representation tokens"

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
