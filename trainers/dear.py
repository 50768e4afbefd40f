"""DeAR: Decomposing Attention-head Roles (Ma et al., CVPR 2026).

Vision: CLIP runs unchanged up to layer J; there K attribute tokens P0 (n_tok each) are
appended, and in layers J..L every head sees them according to its role (role-based
attention mask: core attribute heads see only their own attribute's tokens,
generalization and other specialised heads keep original and attribute tokens apart,
mixed heads are free). Between layers the attribute rows are re-mixed with their raw
value: x <- beta * x + (1 - beta) * P0. The pooled feature of the original tokens gives f_cls
(the frozen head: the class token through ln_post and proj; an attention-pool tower pools the
original tokens only), each attribute's tokens give f_k = head(mean) with the head's final
projection replaced by W_attr (a copy of it; the identity where the head has none, SigLIP).

Text: the dataset's template sentence; at layer J the prompt tokens T0 are inserted after
the start-of-text token (before the first word where the tokenizer has none), re-mixed the
same way after each layer.

Logits = sum_k softmax(a)_k * 100 * cos(f_k, t_c) with f_0 = f_cls (task-adaptive fusion);
INFERENCE cls uses f_cls only; INFERENCE auto (the default) follows the paper for the
evaluation scope: fusion on the training dataset (base, new and source classes: the paper's
base-to-novel, few-shot and transfer-source results), f_cls on targets (cross-dataset and
domain generalization, "decoupled inference"). Loss = CE + lambda_reg * (1 - cos to frozen CLIP, image
and text) + lambda_fusion * (1 - w_0). Layer numbers are 1-indexed in the config and
0-indexed ("block") in the runner.
"""
import os
import random
import re
import shlex

import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import (
    InsertTokens, MapTokens, Plan, PromptedCLIP, fill_template,
)
from vlprompt.clip.head_roles import HeadRole, role_attention_mask
from vlprompt.clip.role_map_registry import MissingRoleMapError, find_role_map
from vlprompt.config import ConfigError, check_choice, check_range, get_cfg_default, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import ScopeRule

MASK_STRATEGIES = ("role", "all_generalization", "all_mixed", "random_shuffle")
FUSION_LOSSES = ("one_minus", "neg_log")
INFERENCE_RULE = ScopeRule("TRAINER.DEAR.INFERENCE", base="fusion", new="fusion", source="fusion", target="cls")


@register_cfg_extension
def add_dear_config(cfg):
    cfg.TRAINER.DEAR = CN()
    cfg.TRAINER.DEAR.ATTRIBUTES = ["color", "shape", "texture", "object", "location"]
    cfg.TRAINER.DEAR.N_ATTR_TOKENS = 1  # tokens per attribute (0: no attribute branch)
    cfg.TRAINER.DEAR.N_CTX_TEXT = 4  # text prompt tokens (0: the plain template)
    cfg.TRAINER.DEAR.INJECT_LAYER = 9  # J, 1-indexed image layer where tokens enter
    cfg.TRAINER.DEAR.TEXT_INJECT_LAYER = 0  # 1-indexed text layer; 0: same as INJECT_LAYER
    cfg.TRAINER.DEAR.BETA = 0.9  # re-mixing: beta * output + (1 - beta) * raw token
    cfg.TRAINER.DEAR.ROLE_MAP = "auto"  # auto: registered for MODEL.BACKBONE NAME+WEIGHTS; or a map name or file
    cfg.TRAINER.DEAR.MASK_STRATEGY = "role"  # role, all_generalization, all_mixed, random_shuffle
    cfg.TRAINER.DEAR.SHUFFLE_SEED = -1  # random_shuffle only; < 0: the run's SEED (shuffle_seed)
    cfg.TRAINER.DEAR.LAMBDA_REG = 1.0
    cfg.TRAINER.DEAR.LAMBDA_FUSION = 0.7
    cfg.TRAINER.DEAR.FUSION_LOSS = "one_minus"  # one_minus: 1 - w_0; neg_log: -log w_0
    cfg.TRAINER.DEAR.INFERENCE = "auto"  # auto (by evaluation scope), fusion or cls (decoupled: f_cls only)
    cfg.TRAINER.DEAR.PREC = "amp"


def check_dear_config(node, backbone=None):
    """Raise ConfigError for an invalid TRAINER.DEAR node (role map included; ``backbone``:
    cfg.MODEL.BACKBONE, which ROLE_MAP auto looks the map up by)."""
    for key, allowed in (("MASK_STRATEGY", MASK_STRATEGIES), ("FUSION_LOSS", FUSION_LOSSES)):
        check_choice(f"TRAINER.DEAR.{key}", node[key], allowed)
    INFERENCE_RULE.check(node.INFERENCE)
    for key, low in (("N_ATTR_TOKENS", 0), ("N_CTX_TEXT", 0), ("INJECT_LAYER", 1), ("TEXT_INJECT_LAYER", 0),
                     ("LAMBDA_REG", 0), ("LAMBDA_FUSION", 0), ("SHUFFLE_SEED", -1)):
        check_range(f"TRAINER.DEAR.{key}", node[key], minimum=low)
    check_range("TRAINER.DEAR.BETA", node.BETA, 0.0, 1.0, why="(1: no re-mixing, 0: raw tokens at every layer)")
    names = list(node.ATTRIBUTES)
    if not all(isinstance(name, str) and name.strip() for name in names) or len(set(names)) != len(names):
        raise ConfigError(f"TRAINER.DEAR.ATTRIBUTES must be distinct attribute names, got {names}.")
    if node.MASK_STRATEGY in ("role", "random_shuffle"):
        role_map = find_role_map(node.ROLE_MAP, *_backbone_key(backbone))
        role_map.check_inject_layer(node.INJECT_LAYER)
        role_map.check_attributes(names)


def head_roles_command(cfg):
    """The tools/head_roles.py command that makes a role map of this run's backbone, decomposing
    images of its dataset from layer INJECT_LAYER on, and the map file it writes."""
    backbone, node = cfg.MODEL.BACKBONE, cfg.TRAINER.DEAR
    stem = os.path.splitext(os.path.basename(backbone.NAME))[0] if backbone.NAME.endswith(".json") else backbone.NAME
    folder = os.path.join("output", "head_roles", re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_"))
    words = ["python", "tools/head_roles.py", "--root", cfg.DATASET.ROOT or "$DATA", "--backbone", backbone.NAME]
    if backbone.WEIGHTS:
        words += ["--weights", backbone.WEIGHTS]
    words += ["--first-layer", str(node.INJECT_LAYER), "--output-dir", folder]
    for key, value in _dataset_settings(cfg.DATASET):
        words += [key, str(value)]
    return " ".join(shlex.quote(word) if word != "$DATA" else word for word in words), \
        os.path.join(folder, "head_roles.yaml")


def _dataset_settings(node, prefix="DATASET", defaults=None):
    """(KEY, value) of the dataset keys that differ from the defaults (the dataset's YAML), but
    the root, the shots and the class subsample, which the head-role tool does not use."""
    if defaults is None:
        defaults = get_cfg_default().DATASET
    settings = []
    for key, value in node.items():
        name = f"{prefix}.{key}"
        if name in ("DATASET.ROOT", "DATASET.NUM_SHOTS", "DATASET.SUBSAMPLE_CLASSES"):
            continue
        default = defaults.get(key) if defaults is not None else None
        if isinstance(value, CN):
            settings += _dataset_settings(value, name, default if isinstance(default, CN) else CN())
        elif value != default:
            settings.append((name, list(value) if isinstance(value, tuple) else value))
    return settings


def _backbone_key(backbone):
    """(NAME, WEIGHTS) of cfg.MODEL.BACKBONE, or empty names when none is given."""
    return (backbone.NAME, backbone.WEIGHTS) if backbone is not None else ("", "")


def shuffle_seed(node, seed):
    """The permutation seed of MASK_STRATEGY random_shuffle and a phrase saying where it came from.

    TRAINER.DEAR.SHUFFLE_SEED when it is >= 0 (an explicit permutation), else the run's
    ``seed`` (cfg.SEED) when it is >= 0, so that every seed of an ablation draws its own
    permutation; an unseeded run (both < 0) draws one at random and names it, so that it
    can be repeated with SHUFFLE_SEED.
    """
    if node.SHUFFLE_SEED >= 0:
        return node.SHUFFLE_SEED, "TRAINER.DEAR.SHUFFLE_SEED"
    if seed >= 0:
        return seed, "SEED"
    drawn = random.SystemRandom().randrange(2**31)
    return drawn, "drawn at random: SEED and TRAINER.DEAR.SHUFFLE_SEED are < 0"


def deep_head_roles(node, num_layers, num_heads, backbone=None, permutation_seed=None):
    """Roles of the image heads in layers J..L under MASK_STRATEGY: {1-indexed layer: roles}.

    ``all_mixed`` gives {} (no mask anywhere); ``all_generalization`` isolates every head;
    ``random_shuffle`` permutes the map's roles with ``permutation_seed`` (None:
    ``shuffle_seed(node, -1)``, i.e. SHUFFLE_SEED, else a random one).
    """
    first = node.INJECT_LAYER
    if node.MASK_STRATEGY in ("role", "random_shuffle"):
        role_map = find_role_map(node.ROLE_MAP, *_backbone_key(backbone))
        role_map.check_backbone(num_layers, num_heads)
        role_map.check_inject_layer(first)
        if node.MASK_STRATEGY == "random_shuffle":
            if permutation_seed is None:
                permutation_seed, _ = shuffle_seed(node, -1)
            role_map = role_map.shuffled(permutation_seed, first)
        return role_map.deep_roles(first)
    if first > num_layers:
        raise ConfigError(f"TRAINER.DEAR.INJECT_LAYER is {first}, but the image tower has {num_layers} layers.")
    if node.MASK_STRATEGY == "all_mixed":
        return {}
    return {layer: (HeadRole("G"),) * num_heads for layer in range(first, num_layers + 1)}


class DeARPrompts(nn.Module):
    """DeAR's learnable tensors (K attributes, n_tok tokens each, n_ctx text tokens).

    Attributes:
        attr_tokens: P0 [K, n_tok, D_v], N(0, 0.02).
        text_tokens: T0 [n_ctx, D_t], N(0, 0.02).
        attr_proj: W_attr [D', E], a copy of the image head's final projection (CLIP's visual
            proj), or the identity [E, E] where the head has none (None when K * n_tok = 0).
        fusion_logits: a [K + 1] zeros; index 0 is the class feature.
    """

    def __init__(self, num_attributes, tokens_per_attribute, n_ctx_text, vision_width, visual_proj, text_width):
        super().__init__()
        shape = (num_attributes, tokens_per_attribute, vision_width)
        self.attr_tokens = nn.Parameter(torch.empty(shape).normal_(std=0.02))
        self.text_tokens = nn.Parameter(torch.empty(n_ctx_text, text_width).normal_(std=0.02))
        has_attributes = num_attributes * tokens_per_attribute > 0
        self.attr_proj = nn.Parameter(visual_proj.detach().clone().float()) if has_attributes else None
        self.fusion_logits = nn.Parameter(torch.zeros(num_attributes + 1))


class DeARCLIP(PromptedCLIP):
    """Frozen CLIP with DeAR's attribute tokens, role masks, text prompts and fusion.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        template: the dataset's sentence template with one "{}".
        node: cfg.TRAINER.DEAR.
        head_roles: {1-indexed image layer: one HeadRole per head} (deep_head_roles).
        eval_scope: the evaluation scope (vlprompt.engine.eval_scope), which INFERENCE auto follows;
            the default, source, evaluates the classes of the training dataset.
    """

    device_caches = PromptedCLIP.device_caches + ("_frozen_text",)  # frozen-CLIP text targets

    def __init__(self, clip, tokenizer, classnames, template, node, head_roles, eval_scope="source"):
        super().__init__(clip)
        self.attributes = tuple(node.ATTRIBUTES) if node.N_ATTR_TOKENS > 0 else ()
        self.tokens_per_attribute = node.N_ATTR_TOKENS
        self.beta = node.BETA
        self.vision_block = node.INJECT_LAYER - 1
        self.text_block = (node.TEXT_INJECT_LAYER or node.INJECT_LAYER) - 1
        if self.text_block >= clip.text.num_layers:
            raise ConfigError(
                f"DeAR's text prompts enter at text layer {self.text_block + 1} (TRAINER.DEAR.TEXT_INJECT_LAYER, "
                f"0 = INJECT_LAYER), but the text tower has {clip.text.num_layers} layers."
            )
        self.lambda_reg, self.lambda_fusion = node.LAMBDA_REG, node.LAMBDA_FUSION
        self.fusion_loss, self.inference = node.FUSION_LOSS, INFERENCE_RULE.resolve(node.INFERENCE, eval_scope)
        self.head_roles = head_roles
        visual = clip.visual
        self.prompt_learner = DeARPrompts(len(self.attributes), self.tokens_per_attribute, node.N_CTX_TEXT,
                                          visual.width, visual.projection_or_identity(), clip.text.width)
        self.tokenizer, self.template = tokenizer, template
        self._masks = {}  # (number of original tokens, device) -> {block: [heads, L, L]}
        self.set_classnames(classnames)

    def set_classnames(self, classnames):
        """Tokenize the template sentences of a class list (room left for the text prompts;
        the runner computes only the positions up to the last end-of-text token)."""
        sentences = [fill_template(self.template, name) for name in classnames]
        ids = self.tokenizer(sentences, reserve=self.prompt_learner.text_tokens.shape[0])
        self.register_buffer("token_ids", ids.to(self.logit_scale.device), persistent=False)
        self._frozen_text = self._eval_text_features = None

    def _remix(self, output, raw):
        """Eq. 5/6: beta * layer output + (1 - beta) * raw tokens."""
        return self.beta * output + (1.0 - self.beta) * raw.to(output.dtype)

    def role_masks(self, num_original, device):
        """{block: [heads, L, L]} role-based masks, built once per sequence length and device."""
        key = (num_original, str(device))
        if key not in self._masks:
            masks = {layer - 1: role_attention_mask(roles, self.attributes, num_original,
                                                    self.tokens_per_attribute, device)
                     for layer, roles in self.head_roles.items()}
            self._masks[key] = {block: mask for block, mask in masks.items() if mask is not None}
        return self._masks[key]

    def vision_plan(self, num_original, device):
        """Append P0 at block J-1, re-mix the attribute rows before blocks J..L-1, role masks."""
        raw = self.prompt_learner.attr_tokens.flatten(0, 1)  # [K * n_tok, D_v]
        if raw.shape[0] == 0:
            return Plan()

        def remix(x):
            original, attributes = x.split([num_original, raw.shape[0]], dim=1)
            return torch.cat([original, self._remix(attributes, raw)], 1)

        layers = {block: MapTokens(remix) for block in range(self.vision_block + 1, self.clip.visual.num_layers)}
        layers[self.vision_block] = InsertTokens(raw)
        return Plan(layers=layers, masks=self.role_masks(num_original, device))

    def text_plan(self):
        """Insert T0 after the start tokens at the text block, re-mix after each block."""
        raw = self.prompt_learner.text_tokens  # [n_ctx, D_t]
        n, first = raw.shape[0], self.tokenizer.start_tokens
        if n == 0:
            return Plan()

        def remix(x):
            start, prompts, rest = x.split([first, n, x.shape[1] - first - n], dim=1)
            return torch.cat([start, self._remix(prompts, raw), rest], 1)

        layers = {block: MapTokens(remix) for block in range(self.text_block + 1, self.clip.text.num_layers)}
        layers[self.text_block] = InsertTokens(raw, at=first, keep_length=True)
        return Plan(layers=layers)

    def compute_text_features(self):
        return self.clip.text(self.token_ids, self.text_plan()).features

    def frozen_text_features(self):
        """Normalised frozen CLIP features of the template sentences [C, E] (a constant, cached)."""
        if self._frozen_text is None:
            with torch.no_grad():
                self._frozen_text = F.normalize(self.clip.text(self.token_ids).features.float(), dim=-1)
        return self._frozen_text

    def encode_image(self, images):
        """Returns f_cls [B, E], attribute features [B, K, E] and the SharedPrefix at layer J:
        the frozen prefix's hidden states [B, N, D_v] and layer J's q, k, v of them (no
        autograd), which the frozen branch of L_reg continues from."""
        visual = self.clip.visual
        prefix = visual.shared_prefix(images, self.vision_block)
        hidden = prefix.hidden
        num_original = hidden.shape[1]
        num_attr = len(self.attributes) * self.tokens_per_attribute
        out = visual(prefix=prefix, plan=self.vision_plan(num_original, hidden.device),
                     rows=range(num_original, num_original + num_attr), pool_keys=range(num_original))
        if not self.attributes:
            return out.features, out.features.new_zeros(out.features.shape[0], 0, out.features.shape[1]), prefix
        attr = out.tokens.unflatten(1, (len(self.attributes), self.tokens_per_attribute))
        return out.features, visual.token_features(attr.mean(2), self.prompt_learner.attr_proj), prefix

    def fusion_weights(self):
        """w = softmax(a): [K + 1], w_0 for the class feature."""
        return self.prompt_learner.fusion_logits.softmax(0)

    def fused_logits(self, f_cls, f_attr, text_features):
        """sum_k w_k * 100 * cos(f_k, t_c): [B, C] from [B, E], [B, K, E] and normalised [C, E]."""
        features = F.normalize(torch.cat([f_cls.unsqueeze(1), f_attr], 1), dim=-1)  # [B, K+1, E]
        similarities = self.logit_scale * features @ text_features.t().to(features.dtype)  # [B, K+1, C]
        return torch.einsum("k,bkc->bc", self.fusion_weights().to(similarities.dtype), similarities)

    def forward(self, images):
        f_cls, f_attr, _ = self.encode_image(images)
        text_features = self.class_text_features()
        if self.inference == "cls":
            return self.cosine_logits(F.normalize(f_cls, dim=-1), text_features.to(f_cls.dtype))
        return self.fused_logits(f_cls, f_attr, text_features)

    def loss(self, images, labels):
        f_cls, f_attr, prefix = self.encode_image(images)
        text_features = F.normalize(self.compute_text_features(), dim=-1)
        logits = self.fused_logits(f_cls, f_attr, text_features)
        ce = F.cross_entropy(logits, labels)
        total, terms = ce, {"ce": ce.detach()}
        if self.lambda_reg > 0:
            with torch.no_grad():
                frozen_image = self.clip.visual(prefix=prefix, rows=()).features
            reg = (1 - F.cosine_similarity(f_cls, frozen_image, dim=-1)).mean() + (
                1 - F.cosine_similarity(text_features, self.frozen_text_features(), dim=-1)).mean()
            total, terms["reg"] = total + self.lambda_reg * reg, reg.detach()
        if self.lambda_fusion > 0:
            log_w = self.prompt_learner.fusion_logits.log_softmax(0)
            fusion = 1 - log_w[0].exp() if self.fusion_loss == "one_minus" else -log_w[0]
            total, terms["fusion"] = total + self.lambda_fusion * fusion, fusion.detach()
        return total, logits, terms


@TRAINER_REGISTRY.register()
class DeAR(ClipTrainer):
    """DeAR trainer; the checkpointed module ("prompt_learner") holds P0, T0, W_attr and a."""

    benchmark_cases = (Case("DeAR/vit_b16_base2new.yaml", TRAIN, train_target=2.2),)

    vit_required_for = "attribute tokens and per-head masks"

    def check_cfg(self, cfg):
        try:
            check_dear_config(cfg.TRAINER.DEAR, cfg.MODEL.BACKBONE)
        except MissingRoleMapError as error:
            command, role_map = head_roles_command(cfg)
            raise MissingRoleMapError(
                f"{error}\nTo make the map of this backbone from this run's dataset, run\n    {command}\nthen rerun "
                f"with TRAINER.DEAR.ROLE_MAP {role_map}."
            ) from None

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node = self.cfg.TRAINER.DEAR
        permutation_seed = None
        if node.MASK_STRATEGY == "random_shuffle":
            permutation_seed, origin = shuffle_seed(node, self.cfg.SEED)
            print(f"Random role shuffle: permutation seed {permutation_seed} ({origin})")
        roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads, self.cfg.MODEL.BACKBONE,
                                permutation_seed)
        counts = [role.kind for layer in roles.values() for role in layer]
        summary = ", ".join(f"{counts.count(k)} {k}" for k in "AOGM") if counts else "no masks"
        layers = f"{node.INJECT_LAYER}..{clip.visual.num_layers}"
        print(f"Head roles ({node.MASK_STRATEGY}) of image layers {layers}: {summary}")
        template = self.dataset_template()
        print(INFERENCE_RULE.describe(node.INFERENCE, self.eval_scope))
        self.model = DeARCLIP(clip, tokenizer, self.classnames, template, node, roles, self.eval_scope).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)
