"""MMRL++: parameter-efficient and interaction-aware representation learning (Guo et al., 2025).

MMRL (trainers/mmrl.py) with three changes; everything else (R, the towers' token placement,
f_cls, t_c, the logits, the loss and the scope-dependent inference) is MMRL's, shared through
the representation-tokens family (:class:`vlprompt.methods.representation_tokens.MMRLCLIP`).

1. Shared residual representation aligners (SRRA, RES_LORA_DIM = r = 4). For each tower one
   shared weight W [D, d_r] (from one random Linear(d_r, D)), and per representation layer l
   its own bias b^l [D] (copies of that Linear's bias) and a low-rank residual A^l [D, r]
   (Kaiming-uniform, a = √5), B^l [r, d_r] (zeros):

       P^l(R) = R (W + A^l B^l)ᵀ + b^l      [K, D]

   At initialisation all layers' maps are equal (B^l = 0), as MMRL's deep copies are.
2. Interaction across layers (BETA = β): the first representation layer inserts P^l(R) after
   CLS/BOT as MMRL does; a later layer l blends the tokens coming out of the previous block
   x_k^{l-1} with its own mapped tokens,

       x_k^l = β·P^l(R) + (1 − β)·x_k^{l-1},   k = 1..K,

   in both towers (β = 1 is MMRL's replacement, β = 0 would keep the previous tokens).
3. The representation-path projection is CLIP's frozen projection plus a low-rank residual
   (PROJ_LORA_DIM = r_p = 64): proj_rep = proj + A_p B_p, A_p [D_v, r_p] (Kaiming-uniform,
   a = √5), B_p [r_p, E] (zeros), so that f_rep = mean_k LN_post(x_k)·proj_rep starts on CLIP's
   projection (MMRL learns a full random [D_v, E] matrix).

Loss and logits as MMRL: α·CE(z_c) + (1−α)·CE(z_r) + λ·(1 − cos(f_cls, f_cls^CLIP))
+ λ·(1 − cos(t_c, t_c^CLIP)), z = 100·f̂·t̂ᵀ, fusion α·z_c + (1−α)·z_r on base/source classes,
z_c on new classes and targets.

Per-dataset settings (upstream trainers/config.py; merged after the config file, before
command-line options): BETA and REG_WEIGHT ``auto`` (DatasetRules) mean "from the table by DATASET.NAME".
The base-to-novel / few-shot table (BASE2NEW_SETTINGS) gives β and λ for the 11 datasets; an
evaluation on a target dataset (cross-dataset, domain generalization) reads β from the
cross-dataset table (TARGET_BETA) by the target's name, as upstream's TASK CD does, and needs
no λ (it does not train). The cross-dataset recipe's λ (0.1: upstream's CD entry for ImageNet,
winning over its config file's 0.2) is written in vit_b16_cross_datasets.yaml. A dataset
missing from a table is a ConfigError naming the key to set.

ViT-B/16 (K 5, d_r 512, 7 layers, r 4, r_p 64): 2,560 + (768·512 + 7·(768 + 768·4 + 4·512))
+ (512·512 + 7·(512 + 512·4 + 4·512)) + (768·64 + 64·512) = 813,312 learnable parameters.

Verified by reading the official code (yunncheng/MMRL @ 27d8821f): trainers/mmrlpp.py
(``Residual_Aligner``, ``Shared_Residual_Representation_Aligner``: one shared weight, per-layer
bias and A, B; ``MMRLpp_Loss``; the inference by TASK and subsample), clip/model_mmrlpp.py
(``ResidualAttentionBlock``: the β blend at the later representation layers of both towers;
``VisionTransformer``: A [width, r_p], B [r_p, output_dim], proj_rep = proj + A·B with CLIP's
frozen ``proj``), trainers/config.py (β and λ per dataset and task), configs/trainers/MMRLpp/.
Upstream names the node TRAINER.MMRLpp; here it is TRAINER.MMRLPP (every node is upper-case: the
precision is read from TRAINER.<NAME upper-cased>.PREC).

Side by side with the official code (tools/official_equivalence.py MMRLpp,
vlprompt_app/fidelity/methods/mmrl.py, tests/test_fidelity.py): upstream's CustomCLIP
and MMRLpp_Loss on a seeded random ViT-B/16 (Dassl.pytorch @ c61a1b57), β 0.7, every learnable
value (R, W, b^l, A^l, B^l of both towers, A_p, B_p) drawn away from its init, 2 images, 3
classes: the fused base-scope logits, the class-token logits, the representation logits and the
training loss with the λ regularisers agree (relative max differences in docs/fidelity.md; tokens
one block early, β and 1 − β exchanged, or two layers' residuals swapped, fail).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule, ScopeRule
from vlprompt.engine.eval_scope import eval_scope
from vlprompt.methods.representation_tokens import (
    MMRLCLIP, RepresentationTokensTrainer, SharedRepresentation, check_representation_config,
)

KEY = "TRAINER.MMRLPP"
INFERENCE_RULE = ScopeRule(f"{KEY}.INFERENCE", base="fusion", new="cls", source="fusion", target="cls")
# DATASET.NAME -> β and λ, upstream's trainers/config.py for TASK B2N and FS.
BASE2NEW_SETTINGS = {
    "ImageNet": {"BETA": 0.9, "REG_WEIGHT": 0.2},
    "FGVCAircraft": {"BETA": 0.9, "REG_WEIGHT": 2.0},
    "UCF101": {"BETA": 0.9, "REG_WEIGHT": 3.0},
    "DescribableTextures": {"BETA": 0.9, "REG_WEIGHT": 7.0},
    "OxfordPets": {"BETA": 0.7, "REG_WEIGHT": 0.01},
    "StanfordCars": {"BETA": 0.7, "REG_WEIGHT": 6.0},
    "Caltech101": {"BETA": 0.6, "REG_WEIGHT": 3.0},
    "SUN397": {"BETA": 0.5, "REG_WEIGHT": 3.0},
    "OxfordFlowers": {"BETA": 0.4, "REG_WEIGHT": 7.0},
    "EuroSAT": {"BETA": 0.2, "REG_WEIGHT": 0.01},
    "Food101": {"BETA": 0.1, "REG_WEIGHT": 1.0},
}
# DATASET.NAME -> β of an evaluation on it as a target, upstream's trainers/config.py for TASK CD.
TARGET_BETA = {
    "ImageNet": 0.9, "ImageNetV2": 0.9, "ImageNetR": 0.9, "ImageNetA": 0.8, "ImageNetSketch": 0.7,
    "FGVCAircraft": 0.9, "UCF101": 0.9, "SUN397": 0.7, "OxfordPets": 0.6, "Caltech101": 0.6,
    "DescribableTextures": 0.5, "OxfordFlowers": 0.4, "StanfordCars": 0.3, "EuroSAT": 0.3, "Food101": 0.3,
}
BASE2NEW_RULES = {
    key: DatasetRule(f"{KEY}.{key}", {name: row[key] for name, row in BASE2NEW_SETTINGS.items()},
                     source="trainers.mmrlpp.BASE2NEW_SETTINGS (evaluation scopes base, new and source)",
                     scopes=("base", "new", "source"))
    for key in ("BETA", "REG_WEIGHT")
}
# A target evaluation does not train, so it reads no λ.
TARGET_BETA_RULE = DatasetRule(f"{KEY}.BETA", TARGET_BETA,
                               source="trainers.mmrlpp.TARGET_BETA (evaluation scope target)", scopes=("target",))


@register_cfg_extension
def add_mmrlpp_config(cfg):
    cfg.TRAINER.MMRLPP = CN()  # upstream: TRAINER.MMRLpp (upper-case here, as every node)
    cfg.TRAINER.MMRLPP.PREC = "amp"  # fp16, fp32, amp or bf16
    cfg.TRAINER.MMRLPP.N_REP_TOKENS = 5  # K
    cfg.TRAINER.MMRLPP.REP_LAYERS = [6, 7, 8, 9, 10, 11, 12]  # 1-based, consecutive, both towers
    cfg.TRAINER.MMRLPP.REP_DIM = 512  # d_r
    cfg.TRAINER.MMRLPP.REG_WEIGHT = "auto"  # λ; auto: from BASE2NEW_SETTINGS by DATASET.NAME
    cfg.TRAINER.MMRLPP.ALPHA = 0.7  # α: CE and fusion weight of z_c
    cfg.TRAINER.MMRLPP.BETA = "auto"  # β in [0, 1]; auto: from the per-dataset tables (by evaluation scope)
    cfg.TRAINER.MMRLPP.RES_LORA_DIM = 4  # r: rank of the per-layer residuals of the aligners
    cfg.TRAINER.MMRLPP.PROJ_LORA_DIM = 64  # r_p: rank of the residual of proj_rep
    cfg.TRAINER.MMRLPP.INFERENCE = "auto"  # auto (by evaluation scope), fusion or cls


def dataset_rule(key, scope):
    """The DatasetRule of TRAINER.MMRLPP.<key> ("BETA" or "REG_WEIGHT") for an evaluation in ``scope``:
    TARGET_BETA for β of a ``target`` evaluation, else BASE2NEW_SETTINGS (ValueError for λ of a target)."""
    for rule in (*BASE2NEW_RULES.values(), TARGET_BETA_RULE):
        if rule.key == f"{KEY}.{key}" and scope in rule.scopes:
            return rule
    raise ValueError(f"{KEY}.{key} is not read in the {scope} evaluation scope.")


def resolved_node(node, dataset, scope):
    """A copy of cfg.TRAINER.MMRLPP with BETA and REG_WEIGHT taken from the tables where they are
    ``auto``; a target evaluation does not train, so its REG_WEIGHT stays as given.

    Raises:
        ConfigError: ``auto`` for a dataset outside the table, β outside [0, 1] or λ < 0.
    """
    node = node.clone()
    node.defrost()
    node.BETA = dataset_rule("BETA", scope).resolve(node.BETA, dataset)
    check_range(f"{KEY}.BETA", node.BETA, minimum=0.0, maximum=1.0)
    if scope != "target":
        node.REG_WEIGHT = dataset_rule("REG_WEIGHT", scope).resolve(node.REG_WEIGHT, dataset)
        check_range(f"{KEY}.REG_WEIGHT", node.REG_WEIGHT, minimum=0.0)
    node.freeze()
    return node


def check_mmrlpp_config(node, dataset, scope):
    check_representation_config(KEY, INFERENCE_RULE, node.INFERENCE, node.N_REP_TOKENS, node.ALPHA,
                                node.REP_LAYERS)
    check_range(f"{KEY}.REP_DIM", node.REP_DIM, minimum=1)
    check_range(f"{KEY}.RES_LORA_DIM", node.RES_LORA_DIM, minimum=1)
    check_range(f"{KEY}.PROJ_LORA_DIM", node.PROJ_LORA_DIM, minimum=1)
    resolved_node(node, dataset, scope)


class LowRankResidual(nn.Module):
    """A [rows, r] (Kaiming-uniform, a = √5) and B [r, cols] (zeros); ``forward()`` = A·B [rows, cols]."""

    def __init__(self, rows, cols, rank):
        super().__init__()
        self.a = nn.Parameter(torch.empty(rows, rank))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.b = nn.Parameter(torch.zeros(rank, cols))

    def forward(self):
        return self.a @ self.b


class SharedResidualAligner(nn.Module):
    """The maps d_r -> D of one tower: P^l(x) = x (W + A^l B^l)ᵀ + b^l.

    Attributes:
        weight: W [D, d_r], shared by the layers. bias: b^l [D] per layer (equal at init).
        residuals: A^l [D, r], B^l [r, d_r] per layer.
    """

    def __init__(self, rep_dim, width, num_layers, rank):
        super().__init__()
        base = nn.Linear(rep_dim, width)
        self.weight = nn.Parameter(base.weight.detach().clone())
        self.bias = nn.ParameterList(nn.Parameter(base.bias.detach().clone()) for _ in range(num_layers))
        self.residuals = nn.ModuleList(LowRankResidual(width, rep_dim, rank) for _ in range(num_layers))

    def __len__(self):
        return len(self.residuals)

    def forward(self, x, layer):
        """P^layer(x): x [..., d_r] -> [..., D] (``layer`` 0-based among the representation layers)."""
        return F.linear(x, self.weight + self.residuals[layer](), self.bias[layer])


class BlendTokens:
    """Runner edit of a later representation layer: positions at..at+K-1 become
    β·tokens + (1 − β)·(the tokens there), tokens [K, D] shared by the batch."""

    def __init__(self, tokens, beta, at):
        self.tokens, self.beta, self.at = tokens, beta, at

    def __call__(self, x, state):
        n, at = self.tokens.shape[0], self.at
        mixed = self.beta * self.tokens.to(x.dtype) + (1 - self.beta) * x[:, at:at + n]
        return torch.cat([x[:, :at], mixed, x[:, at + n:]], dim=1)


class ResidualRepresentationLearner(SharedRepresentation):
    """MMRL++'s R [K, d_r], the aligners of both towers, β and the residual of proj_rep.

    Attributes:
        rep: R. visual, text: :class:`SharedResidualAligner` to D_v / D_t.
        proj_residual: A_p [D', r_p], B_p [r_p, E] (D': what the image head's final projection reads,
            D_v for CLIP). beta: β (a float, not learned).
    """

    def __init__(self, n_tokens, rep_dim, num_layers, vision_width, text_width, embed_dim, rank, proj_rank, beta,
                 projection_width=None):
        super().__init__(n_tokens, rep_dim)
        self.visual = SharedResidualAligner(rep_dim, vision_width, num_layers, rank)
        self.text = SharedResidualAligner(rep_dim, text_width, num_layers, rank)
        self.proj_residual = LowRankResidual(projection_width or vision_width, embed_dim, proj_rank)
        self.beta = beta

    def layer_tokens(self, tower):
        """[P^l(R) [K, D] for each representation layer l] of ``tower``."""
        aligner = getattr(self, tower)
        return [aligner(self.rep, layer) for layer in range(len(aligner))]

    def later_edit(self, tokens, at):
        return BlendTokens(tokens, self.beta, at)

    def image_projection(self, proj):
        """proj + A_p·B_p [D', E] (``proj``: the image head's frozen projection, CLIP's)."""
        return proj + self.proj_residual()


class MMRLppCLIP(MMRLCLIP):
    """Frozen CLIP with MMRL++'s representation tokens; ``node`` is cfg.TRAINER.MMRLPP with BETA
    resolved (:func:`resolved_node`); other arguments as
    :class:`vlprompt.methods.representation_tokens.MMRLCLIP`."""

    NAME, KEY = "MMRL++", KEY

    def build_representation(self, node, rep_dim, num_layers):
        if isinstance(node.BETA, str) or not 0 <= node.BETA <= 1:
            raise ConfigError(f"{KEY}.BETA must be resolved to a value in [0, 1] (resolved_node), got {node.BETA}.")
        clip = self.clip
        print(f"MMRL++: β {node.BETA}, residual rank {node.RES_LORA_DIM}, projection rank {node.PROJ_LORA_DIM}")
        return ResidualRepresentationLearner(
            node.N_REP_TOKENS, rep_dim, num_layers, clip.visual.width, clip.text.width, clip.visual.output_dim,
            node.RES_LORA_DIM, node.PROJ_LORA_DIM, node.BETA, clip.visual.projection_input_dim,
        )


@TRAINER_REGISTRY.register()
class MMRLpp(RepresentationTokensTrainer):
    """MMRL++ trainer; the checkpointed module ("representation") holds R, the aligners and the
    projection residual (β is a setting, not a weight)."""

    # β and λ are per dataset: the benchmark's stand-in classes take the Pets ones.
    benchmark_cases = (Case("MMRLpp/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),)

    model_class = MMRLppCLIP
    inference_rule = INFERENCE_RULE

    def check_cfg(self, cfg):
        check_mmrlpp_config(cfg.TRAINER.MMRLPP, cfg.DATASET.NAME, eval_scope(cfg))

    def model_settings(self):
        given, dataset, scope = self.cfg.TRAINER.MMRLPP, self.cfg.DATASET.NAME, self.eval_scope
        node = resolved_node(given, dataset, scope)
        print(dataset_rule("BETA", scope).describe(given.BETA, dataset))
        if scope != "target":
            print(dataset_rule("REG_WEIGHT", scope).describe(given.REG_WEIGHT, dataset))
        return node, node.REP_DIM, node.REG_WEIGHT
