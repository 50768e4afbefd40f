"""DePT: Decoupled Prompt Tuning (Zhang et al., CVPR 2024), on CoOp or MaPLe.

DePT keeps a base prompt-learning method (TRAINER.DEPT.BASE: "CoOp" or "MaPLe", built from its
own node TRAINER.COOP / TRAINER.MAPLE, composed here, not copied) and adds, on top of its
UNNORMALISED features f [B, E] (image) and t [C, E] (class texts):

* channel-wise transforms (FiLM) γ_I, β_I, γ_T, β_T ∈ R^E (init 1 and 0): x -> γ ⊙ x + β;
* a linear head W ∈ R^{C_base×E} with bias b on the transformed features: h(x) = W x + b.

Training (the base method's own logits s·f̂·t̂ᵀ, s = exp(logit_scale)):
    L = (1 - w)·CE(s·f̂·t̂ᵀ, y) + w·CE(h([γ_T ⊙ t_y + β_T ; γ_I ⊙ f + β_I]), [y; y]),
with w = HEAD_WEIGHT = 0.7, i.e. the head sees 2B samples: the true classes' text features
t_y [B, E] stacked on top of the image features [B, E], both labelled y. The base method's
node's PREC is not read (TRAINER.DEPT.PREC is the precision).

Inference (TRAINER.DEPT.INFERENCE, a ScopeRule; ``auto`` follows the evaluation scope):
* ``fused`` (auto for base and source): (1 - w)·s·f̂·t̂ᵀ + w·h(γ_I ⊙ f + β_I), a weighted sum of
  LOGITS (not of probabilities);
* ``sim`` (auto for new and target): s·f̂·t̂ᵀ only, the base method's logits.
The head scores only the classes it was trained on: it is built for the base and source scopes
(the training classes of the training dataset) and not for new, where INFERENCE ``fused`` is a
ConfigError (an error, not a silent fallback to ``sim``), as it is on a target.

On a target with INFERENCE ``auto``, TRAINER.DEPT.TARGET_FUSION chooses:
* ``upstream`` (default): when every class of the target is one of the head's classes (the
  checkpoint's trainer state records them as "head_classnames": the source's classes), loading
  the checkpoint gives the target a head of the trained rows of its classes, picked by name in
  the target's order, and the target is ``fused``; otherwise (a class the head was not trained
  on, or a checkpoint without the names) it stays ``sim``. A log line says which and why. This
  is the domain-generalization targets' rule (ImageNet-V2/-Sketch with all 1,000 rows, -A/-R
  with the rows of their 200 classes; SyntheticShapesV2/-Sketch with all 80 rows);
* ``off``: ``sim`` on every target (this project's earlier behaviour).

Learning rates: two parameter groups, the base method's prompts at OPTIM.LR and FiLM + head at
OPTIM.LR × HEAD_LR_MULT (6.5), both under the same warm-up and cosine schedule.

Verified by reading the official code (Koorye/DePT @ d4ff4168): trainers/elp_maple.py and
elp_coop.py (FiLM init ones/zeros with bias; the head nn.Linear(E, C) with bias applied to the
FiLM-ed unnormalised features; training concatenates text_feats[labels] before img_feats with
labels cat([labels, labels]); the similarity logits use the features WITHOUT FiLM; the loss and
the test-time fusion are (1 - WEIGHT)·sim + WEIGHT·head on logits with WEIGHT 0.7; the head
exists when SUBSAMPLE_CLASSES is base, or all on a dataset whose name contains "ImageNet",
otherwise similarity only; for ImageNet-A/-R its loader cuts the head's rows to the classes whose
folders the target has), trainers/optim.py and train.py's extend_cfg (STAGED_LR with
NEW_LAYERS ['linear_probe', 'film'], LR 0.0035, LR_EXP 6.5, BASE_LR_MULT 1: the prompts get
0.0035 and FiLM + head 0.0035 × 6.5; the warm-up's constant 1e-5 applies to both groups), and
configs/trainers/ExtrasLinearProbe{MaPLe,CoOp}/ (our vit_b16_*.yaml). Difference: upstream
decides by the dataset's name ("ImageNet" in it, with all classes); here the evaluation scope
and, on a target, the class names decide (TARGET_FUSION upstream), so the synthetic
domain-generalization targets, which are not ImageNet-named, are fused as upstream fuses
ImageNet's, and a cross-dataset target with other classes is ``sim``.
Run side by side with the official code on both bases (tools/official_equivalence.py DePT-MaPLe
and DePT-CoOp, Koorye/DePT @ d4ff4168 trainers/elp_maple.py and elp_coop.py with Dassl.pytorch @
c61a1b57, on a seeded random ViT-B/16 with the base's prompts (MaPLe's prompts and couplings;
CoOp's 16 shared context vectors), FiLM γ/β and the head all drawn away from their inits;
fixtures tests/fixtures/official/dept-maple.json and dept-coop.json, test
tests/test_fidelity.py): on MaPLe and on CoOp, the similarity logits, head
logits, fused base-scope logits and training loss (0.3·CE + 0.7·CE_head over [text_y; image])
agree; the relative max differences are in docs/fidelity.md.
tests/test_dept.py checks the equations above independently.
"""
import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP
from vlprompt.config import ConfigError, check_choice, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.fine_tuning import classifier_rows
from vlprompt.engine.option_rules import AUTO, ScopeRule
from vlprompt.engine.eval_scope import eval_scope
from vlprompt.engine.run_folder import RunFolder
from vlprompt.methods.coupled_prompts import MaPLeCLIP, check_maple_cfg
from vlprompt.methods.text_context import CoOpCLIP
from vlprompt.utils import load_checkpoint

# TRAINER.DEPT.BASE -> (the check of the base node, None: CoOp's has none; base model; its node).
BASES = {"CoOp": (None, CoOpCLIP, "COOP"), "MaPLe": (check_maple_cfg, MaPLeCLIP, "MAPLE")}
INFERENCE_RULE = ScopeRule("TRAINER.DEPT.INFERENCE", base="fused", new="sim", source="fused", target="sim")
HEAD_SCOPES = ("base", "source")  # scopes that score the training classes, which the head knows
TARGET_FUSIONS = ("upstream", "off")  # TRAINER.DEPT.TARGET_FUSION (module docstring)


@register_cfg_extension
def add_dept_config(cfg):
    cfg.TRAINER.DEPT = CN()
    cfg.TRAINER.DEPT.BASE = "MaPLe"  # base method: CoOp or MaPLe (its prompts from TRAINER.COOP / TRAINER.MAPLE)
    cfg.TRAINER.DEPT.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA (the base node's PREC is unused)
    cfg.TRAINER.DEPT.HEAD_WEIGHT = 0.7  # w: loss and fusion (1 - w)·sim + w·head (LINEAR_PROBE.WEIGHT upstream)
    cfg.TRAINER.DEPT.HEAD_LR_MULT = 6.5  # FiLM and head train at OPTIM.LR × this (LR_EXP upstream)
    cfg.TRAINER.DEPT.INFERENCE = "auto"  # auto (by evaluation scope), fused or sim
    # INFERENCE auto on a target: upstream (fuse the head's rows of its classes when it knows them all) or off (sim)
    cfg.TRAINER.DEPT.TARGET_FUSION = "upstream"


class FiLM(nn.Module):
    """Channel-wise transform x -> γ ⊙ x + β on [N, E]; γ (``scale``) starts at 1, β (``shift``) at 0."""

    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return x * self.scale.to(x.dtype) + self.shift.to(x.dtype)


class DePTCLIP(PromptedCLIP):
    """A base method's model (CoOpCLIP or MaPLeCLIP) plus DePT's FiLM and linear head.

    Args:
        base: the base method's model; it provides ``compute_text_features()`` [C, E] and
            ``unnormalised_image_features(images)`` [B, E].
        node: cfg.TRAINER.DEPT.
        inference: "fused" or "sim" (INFERENCE_RULE resolved for the evaluation scope).
        head_classes: C, the classes the head scores (those of ``base``), or 0 for no head
            (then ``inference`` must be "sim" and ``loss`` cannot be used).

    Attributes:
        film_image, film_text: FiLM(E), γ_I/β_I and γ_T/β_T.
        head: Linear(E, C) with bias, or None.
    """

    def __init__(self, base, node, inference, head_classes):
        super().__init__(base.clip)
        if inference == "fused" and not head_classes:
            raise ValueError("DePT's fused inference needs the linear head (head_classes > 0)")
        self.base = base
        self.weight, self.inference = node.HEAD_WEIGHT, inference
        dim = base.clip.text.output_dim
        self.film_image, self.film_text = FiLM(dim), FiLM(dim)
        self.head = nn.Linear(dim, head_classes) if head_classes else None

    def head_parameters(self):
        """FiLM's and the head's parameters (the group trained at LR × HEAD_LR_MULT)."""
        modules = [self.film_image, self.film_text] + ([self.head] if self.head is not None else [])
        return [p for module in modules for p in module.parameters()]

    def attach_head(self, weight, bias):
        """Give the model the head ``weight`` [C, E], ``bias`` [C] (trained rows of the current
        C classes) and make its inference ``fused``."""
        parameter = self.film_image.scale
        head = nn.Linear(weight.shape[1], weight.shape[0]).to(device=parameter.device, dtype=parameter.dtype)
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
        self.head, self.inference = head, "fused"

    def compute_text_features(self):
        return self.base.compute_text_features()

    def similarity_logits(self, image_features, text_features):
        """s·f̂·t̂ᵀ [B, C] from unnormalised image features [B, E] and normalised text features [C, E]."""
        image_features = F.normalize(image_features, dim=-1)
        return self.cosine_logits(image_features, text_features.to(image_features.dtype))

    def head_logits(self, image_features):
        """h(γ_I ⊙ f + β_I) [B, C] from unnormalised image features f [B, E]."""
        return self.head(self.film_image(image_features))

    def forward(self, images):
        features = self.base.unnormalised_image_features(images)
        logits = self.similarity_logits(features, self.class_text_features())
        if self.inference == "sim":
            return logits
        return (1.0 - self.weight) * logits + self.weight * self.head_logits(features)

    def loss(self, images, labels):
        """((1 - w)·CE_sim + w·CE_head, fused logits of the images [B, C], {"ce", "head"}).

        CE_head is over the 2B rows [γ_T ⊙ t_y + β_T ; γ_I ⊙ f + β_I] with labels [y; y].
        """
        if self.head is None:
            raise RuntimeError("DePT was built without its linear head (a new or target scope); it cannot train")
        features = self.base.unnormalised_image_features(images)
        text = self.compute_text_features()
        logits = self.similarity_logits(features, F.normalize(text, dim=-1))
        rows = torch.cat([self.film_text(text[labels]).to(features.dtype), self.film_image(features)])
        head_logits = self.head(rows)
        ce, head = F.cross_entropy(logits, labels), F.cross_entropy(head_logits, torch.cat([labels, labels]))
        total = (1.0 - self.weight) * ce + self.weight * head
        fused = (1.0 - self.weight) * logits + self.weight * head_logits[len(labels):]
        return total, fused, {"ce": ce.detach(), "head": head.detach()}


@TRAINER_REGISTRY.register()
class DePT(ClipTrainer):
    """DePT trainer; the whole model ("DePT": the base method's learnable part, FiLM and head)
    is registered with two parameter groups."""

    benchmark_cases = (
        Case("DePT/vit_b16_maple.yaml", TRAIN),
        Case("DePT/vit_b16_coop.yaml", TRAIN, name="DePT+CoOp", synthetic_opts=("TRAINER.DEPT.BASE", "CoOp")),
    )

    def check_cfg(self, cfg):
        node = cfg.TRAINER.DEPT
        check_choice("TRAINER.DEPT.BASE", node.BASE, list(BASES))
        check_choice("TRAINER.DEPT.TARGET_FUSION", node.TARGET_FUSION, list(TARGET_FUSIONS))
        check_range("TRAINER.DEPT.HEAD_WEIGHT", node.HEAD_WEIGHT, minimum=0.0, maximum=1.0)
        if node.HEAD_LR_MULT <= 0:
            raise ConfigError(f"TRAINER.DEPT.HEAD_LR_MULT must be > 0, got {node.HEAD_LR_MULT!r}.")
        scope = eval_scope(cfg)
        if INFERENCE_RULE.resolve(node.INFERENCE, scope) == "fused" and scope not in HEAD_SCOPES:
            raise ConfigError(
                f"TRAINER.DEPT.INFERENCE fused needs the linear head, which scores only the classes it was "
                f"trained on (evaluation scopes {' and '.join(HEAD_SCOPES)}); the {scope} scope scores other "
                "classes: use INFERENCE auto or sim (auto with TARGET_FUSION upstream fuses a target whose "
                "classes are all among the head's)."
            )
        check_base = BASES[node.BASE][0]
        if check_base is not None:
            check_base(cfg)  # the base node (prompt sizes, init phrase)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        node = self.cfg.TRAINER.DEPT
        _, base_model, base_key = BASES[node.BASE]
        base = base_model(clip, tokenizer, self.classnames, self.cfg.TRAINER[base_key])
        print(f"DePT on {node.BASE}; " + INFERENCE_RULE.describe(node.INFERENCE, self.eval_scope))
        if self.fuses_target_on_load:
            print("TRAINER.DEPT.TARGET_FUSION: upstream (the loaded checkpoint's head is fused in when it was "
                  "trained on every class of this dataset)")
        inference = INFERENCE_RULE.resolve(node.INFERENCE, self.eval_scope)
        head_classes = len(self.classnames) if self.eval_scope in HEAD_SCOPES else 0
        self.model = DePTCLIP(base, node, inference, head_classes).to(self.device)
        head = set(map(id, self.model.head_parameters()))
        prompts = [p for p in self.model.parameters() if p.requires_grad and id(p) not in head]
        lr = self.cfg.OPTIM.LR
        self.register_learner("DePT", self.model, params=[
            {"params": prompts, "lr": lr},
            {"params": self.model.head_parameters(), "lr": lr * node.HEAD_LR_MULT},
        ])

    @property
    def fuses_target_on_load(self):
        """True when ``load_model`` may give a target the head's rows (INFERENCE auto, TARGET_FUSION upstream)."""
        node = self.cfg.TRAINER.DEPT
        return self.eval_scope == "target" and node.INFERENCE == AUTO and node.TARGET_FUSION == "upstream"

    def get_class_dependent_keys(self, name):
        # The head scores the training classes; the other scopes drop its stored rows (a target
        # gets the rows of its classes in load_model).
        return [] if self.eval_scope in HEAD_SCOPES else ["head.weight", "head.bias"]

    def get_trainer_state(self):
        """The engine's state plus "head_classnames", the C classes of the head's rows (when it has one)."""
        state = super().get_trainer_state()
        if self.model.head is not None:
            state["head_classnames"] = list(self.classnames)
        return state

    def load_model(self, directory, epoch=None):
        """The engine's load_model; then, on a target with TARGET_FUSION upstream, the checkpoint's
        head rows of this dataset's classes, when it has all of them (module docstring)."""
        super().load_model(directory, epoch)
        if directory and self.fuses_target_on_load:
            self.fuse_target_head(RunFolder(directory).checkpoint_path("DePT", epoch))

    def fuse_target_head(self, model_path):
        """Attach the head rows of the current classes from the checkpoint ``model_path`` when its
        head was trained on all of them (then inference is ``fused``); print which it did and why."""
        checkpoint = load_checkpoint(str(model_path))
        trained = (checkpoint.get("trainer_state") or {}).get("head_classnames")
        state = checkpoint["state_dict"]
        if trained is None or "head.weight" not in state:
            print(f'DePT target fusion: sim, "{model_path}" records no head classes (a checkpoint saved '
                  "without them); train again to fuse the head on this target")
            return
        known = set(trained)
        unknown = [name for name in self.classnames if name not in known]
        if unknown:
            print(f"DePT target fusion: sim, {len(unknown)} of the {len(self.classnames)} classes of this dataset "
                  f"are not among the head's {len(trained)} training classes (e.g. {unknown[:3]})")
            return
        rows = classifier_rows(torch.arange(len(trained)), trained, self.classnames, model_path)
        self.model.attach_head(state["head.weight"][rows], state["head.bias"][rows])
        print(f"DePT target fusion: fused, the head's rows of this dataset's {len(rows)} classes "
              f"(of its {len(trained)} training classes)")
