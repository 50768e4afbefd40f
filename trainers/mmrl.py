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

The representation space, the model (``MMRLCLIP``) and the trainer's building are the
representation-tokens family (vlprompt/methods/representation_tokens.py), which MMRL++ builds
on; this file holds MMRL's node, its per-dataset settings and inference rule.
"""
from yacs.config import CfgNode as CN

from vlprompt.config import check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule, ScopeRule
from vlprompt.methods.representation_tokens import MMRLCLIP, RepresentationTokensTrainer, check_representation_config

INFERENCE_RULE = ScopeRule("TRAINER.MMRL.INFERENCE", base="fusion", new="cls", source="fusion", target="cls")
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


def check_mmrl_config(node, dataset):
    check_representation_config("TRAINER.MMRL", INFERENCE_RULE, node.INFERENCE, node.N_REP_TOKENS,
                                node.ALPHA, node.REP_LAYERS)
    dataset_settings(node, dataset)


@TRAINER_REGISTRY.register()
class MMRL(RepresentationTokensTrainer):
    """MMRL trainer; the checkpointed module ("representation") holds R, P_v, P_t and proj_rep."""

    # λ and the representation width are per dataset: the benchmark's stand-in classes take the Pets ones.
    benchmark_cases = (Case("MMRL/vit_b16.yaml", TRAIN, opts=("DATASET.NAME", "OxfordPets")),)

    model_class = MMRLCLIP
    inference_rule = INFERENCE_RULE

    def check_cfg(self, cfg):
        check_mmrl_config(cfg.TRAINER.MMRL, cfg.DATASET.NAME)

    def model_settings(self):
        """(node, d_r, λ) for ``model_class``, the per-dataset values resolved (and logged)."""
        node, dataset = self.cfg.TRAINER.MMRL, self.cfg.DATASET.NAME
        settings = dataset_settings(node, dataset)
        print(DATASET_RULES["REP_DIM"].describe(node.REP_DIM, dataset))
        print(DATASET_RULES["REG_WEIGHT"].describe(node.REG_WEIGHT, dataset))
        return (node, *settings)
