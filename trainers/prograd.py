"""ProGrad: Prompt-aligned Gradient for prompt tuning (Zhu et al., ICCV 2023).

Model: CoOp's (frozen CLIP, a learnable context ctx [n, D] (n = N_CTX = 16, D = 512) in the
prompt "[SOS] ctx_1 ... ctx_n <class>."), logits_s = 100 * cos(f̂_img, f̂_text) [B, C].
With CTX_INIT, the prompt is ProGrad's dataset template (``PROGRAD_TEMPLATES``, e.g.
"a type of pet, a photo of a {}."): its first w words (w = number of space-separated words
of the phrase before "{}") initialise the LAST w context slots, the n - w earlier slots
start at ZERO, and the template's tokens after slot n stay frozen in the suffix.

Zero-shot teacher: the same frozen CLIP with the hand-crafted sentence of the same template
per class, logits_zs [B, C] (no gradient; it shares the student's image features).

Update (one optimizer step per batch; only the CE is optimised, the KL only gives a direction):

    L_ce = CE(logits_s, y)
    L_kl = -mean_b sum_c softmax(logits_zs / T)_c · log softmax(logits_s / T)_c · T²   (T = 1)
    g_d = ∇ L_ce,  g_g = ∇ L_kl,  ĝ_g = g_g / ||g_g||      (per learnable parameter tensor)
    g = g_d - λ · min(⟨g_d, ĝ_g⟩, 0) · ĝ_g                   (λ = TRAINER.PROGRAD.LAMBDA)

i.e. a gradient that conflicts with the zero-shot direction loses λ times its component along
it (λ = 1: orthogonal to ĝ_g), an agreeing one is kept. The rule is equivariant to a common
positive scale s of both losses (ĝ_g does not change, g_d and the result scale by s), so under
a GradScaler it runs on the scaled gradients and the scaler unscales the result; an overflow
in g_g makes ĝ_g and g non-finite, so the scaler skips the step as for any overflow. g_g = 0
leaves g_d unchanged. Inference is CoOp's.

Verified by reading BeierZhu/Prompt-align @ 1b762036 (ProGrad.public/trainers/prograd.py and
Dassl.ProGrad.pytorch/dassl/engine/trainer.py ``prograd_backward_and_update``):
* the projection: backward of the KL, clone the gradients, zero them, backward of the CE, then
  per ``parameters()`` tensor ``if dot(ĝ_d, ĝ_g) < 0: g = g_d - λ dot(g_d, ĝ_g) ĝ_g``, one step;
  T² multiplies the soft cross-entropy before the batch mean (ProGradLoss), T = LOSS.T = 1.0;
* λ = LOSS.LAMBDA, 1.0 in the base-to-novel scripts (ProGrad.public/README.md: the few-shot
  runs use 0.8 for Flowers102, DTD and EuroSAT at 8 and 16 shots);
* CTX_INIT True takes the prefix of CUSTOM_TEMPLATES[DATASET.NAME] into the last w of 16
  slots, earlier slots zero; only the official fp16/fp32 branch projects (its "amp" branch
  scales the (CE, KL) tuple and cannot back-propagate it); ours projects at every precision.
  The teacher there is a second fp32 copy of CLIP encoding the image again; ours reuses the
  student's image features (the same frozen encoder).
Compared by running BeierZhu/Prompt-align @ 1b762036 (ProGrad.public with its Dassl.ProGrad.pytorch,
fp32, OxfordPets template, CTX_INIT True) on a seeded random ViT-B/16, a context at 10x its init std
and a batch whose CE and KL gradients conflict: student and zero-shot logits, CE, KL and the
projected ctx update of its prograd_backward_and_update agree (tools/official_equivalence.py,
tests/fixtures/official/prograd.json, tests/test_fidelity.py; relative max
differences in docs/fidelity.md). tests/test_prograd.py checks one update against an
independent autograd re-computation of the equations above.

Config node TRAINER.PROGRAD (the reference keeps N_CTX/CSC/CTX_INIT/PREC/CLASS_TOKEN_POSITION
under TRAINER.COOP and LAMBDA/T under LOSS).
"""
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from vlprompt.clip import CLASS_TOKEN_POSITIONS, fill_template
from vlprompt.config import ConfigError, check_choice, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.engine.option_rules import DatasetRule
from vlprompt.engine.steps import step_summary
from vlprompt.methods.prograd_templates import PROGRAD_TEMPLATES
from vlprompt.methods.text_context import CoOpCLIP
from vlprompt.metrics import compute_accuracy

# A dataset outside the table takes its own template (no config option sets ProGrad's).
TEMPLATE_RULE = DatasetRule("ProGrad's template", PROGRAD_TEMPLATES, default="", option=False, fallback="template",
                            source="vlprompt.methods.prograd_templates.PROGRAD_TEMPLATES")


@register_cfg_extension
def add_prograd_config(cfg):
    cfg.TRAINER.PROGRAD = CN()
    cfg.TRAINER.PROGRAD.N_CTX = 16  # number of context vectors
    cfg.TRAINER.PROGRAD.CSC = False  # class-specific context
    cfg.TRAINER.PROGRAD.CTX_INIT = False  # True: the last slots start from the dataset template's words
    cfg.TRAINER.PROGRAD.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.PROGRAD.CLASS_TOKEN_POSITION = "end"  # end, middle or front
    cfg.TRAINER.PROGRAD.LAMBDA = 1.0  # λ: how much of a conflicting component is removed
    cfg.TRAINER.PROGRAD.T = 1.0  # temperature of the zero-shot soft target


def project_conflicting(grad_ce, grad_kl, lam):
    """ProGrad's rule for one parameter tensor: g_d - λ·min(⟨g_d, ĝ_g⟩, 0)·ĝ_g.

    Args:
        grad_ce: g_d, gradient of the CE, any shape. grad_kl: g_g, same shape. lam: λ.

    Returns:
        tensor of g_d's shape; g_d itself when g_g = 0; non-finite when g_g is.
    """
    unit = F.normalize(grad_kl.flatten().float(), dim=0)
    flat = grad_ce.flatten().float()
    conflict = torch.clamp(flat @ unit, max=0.0)  # keeps NaN, so an overflow stays visible
    return (flat - lam * conflict * unit).view_as(grad_ce).to(grad_ce.dtype)


def soft_cross_entropy(logits, target_logits, temperature):
    """-mean_b Σ_c softmax(target/T)·log softmax(logits/T)·T² from [B, C] logits (target without grad)."""
    target = F.softmax(target_logits.detach().float() / temperature, dim=-1)
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(target * log_probs).sum(dim=-1).mean() * temperature**2


def template_for(dataset_name, dataset_template):
    """ProGrad's template of a dataset: ``PROGRAD_TEMPLATES``, else the dataset's own.

    Raises ConfigError when the template does not end with " {}." (the class name must close
    the sentence for the prompt prefix to be the template's words).
    """
    template = TEMPLATE_RULE.lookup(dataset_name, own=dataset_template)
    if not template.endswith(" {}."):
        raise ConfigError(
            f'ProGrad needs a template ending with " {{}}." for dataset "{dataset_name}", got "{template}": '
            "add one to PROGRAD_TEMPLATES in vlprompt/methods/prograd_templates.py."
        )
    return template


class ProGradCLIP(CoOpCLIP):
    """CoOp's model with ProGrad's context initialisation and its zero-shot teacher.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names. node: cfg.TRAINER.PROGRAD.
        template: ProGrad's sentence template ("{}" = class name, last).

    Attributes:
        zs_text_features: buffer [C, E], normalised frozen CLIP features of the template
            sentences (rebuilt with the class list, never saved).
    """

    def __init__(self, clip, tokenizer, classnames, node, template):
        super().__init__(clip, tokenizer, classnames, _without_init(node))
        self.temperature = node.T
        if node.CTX_INIT:
            self._init_context_from(template[: -len(" {}.")], tokenizer, classnames)
        sentences = [fill_template(template, name) for name in classnames]
        print(f"Zero-shot teacher prompts: {sentences}")
        with torch.no_grad():
            target = self.encode_sentences(tokenizer(sentences).to(clip.logit_scale.device))
        self.register_buffer("zs_text_features", F.normalize(target, dim=-1), persistent=False)

    def _init_context_from(self, phrase, tokenizer, classnames):
        """Last w slots := the phrase's first w token embeddings, earlier ones zero; the prompt
        text becomes "X ... X <phrase> <class>." so the suffix holds the rest of the phrase."""
        learner = self.prompt_learner
        words = len(phrase.split(" "))
        if words > learner.n_ctx:
            raise ConfigError(
                f'TRAINER.PROGRAD.N_CTX ({learner.n_ctx}) must be at least the number of words of the template '
                f'prefix "{phrase}" ({words}) when TRAINER.PROGRAD.CTX_INIT is True.'
            )
        with torch.no_grad():
            ids = tokenizer([phrase]).to(self.clip.logit_scale.device)
            start = tokenizer.start_tokens
            embedded = self.clip.text.embed(ids)[0, start:start + words].float()
            learner.ctx.zero_()
            learner.ctx[..., learner.n_ctx - words :, :] = embedded.to(learner.ctx.device)
        learner.phrase = " ".join(["X"] * (learner.n_ctx - words) + [phrase])
        learner.set_classnames(classnames)
        print(f'Initial context: "{learner.phrase}"')

    def losses(self, images, labels):
        """(L_ce, L_kl, student logits [B, C]) for images [B, 3, H, W] and labels [B]."""
        image_features = F.normalize(self.clip.encode_image(images), dim=-1)
        logits = self.cosine_logits(image_features, self.class_text_features())
        with torch.no_grad():
            zs_logits = self.cosine_logits(image_features, self.zs_text_features.to(image_features.dtype))
        return F.cross_entropy(logits, labels), soft_cross_entropy(logits, zs_logits, self.temperature), logits


def _without_init(node):
    """The node CoOpCLIP reads: N_CTX random vectors (ProGrad places the template words itself)."""
    node = node.clone()
    node.defrost()
    node.CTX_INIT = ""
    return node


@TRAINER_REGISTRY.register()
class ProGrad(ClipTrainer):
    """ProGrad trainer; the checkpointed module is the prompt learner (the context)."""

    benchmark_cases = (Case("ProGrad/vit_b16_ep100.yaml", TRAIN),)

    exports_class_text_features = True

    def check_cfg(self, cfg):
        node = cfg.TRAINER.PROGRAD
        check_choice("TRAINER.PROGRAD.CLASS_TOKEN_POSITION", node.CLASS_TOKEN_POSITION, CLASS_TOKEN_POSITIONS)
        check_range("TRAINER.PROGRAD.N_CTX", node.N_CTX, minimum=1)
        check_range("TRAINER.PROGRAD.LAMBDA", node.LAMBDA, minimum=0.0)
        if not node.T > 0:
            raise ConfigError(f"TRAINER.PROGRAD.T must be > 0 (a softmax temperature), got {node.T}.")
        for key, value in (("CSC", node.CSC), ("CTX_INIT", node.CTX_INIT)):
            if not isinstance(value, bool):
                raise ConfigError(f"TRAINER.PROGRAD.{key} must be True or False, got {value!r}.")

    def build_model(self):
        clip, tokenizer = self.build_clip()
        template = template_for(self.cfg.DATASET.NAME, self.dataset_template())
        node = self.cfg.TRAINER.PROGRAD
        self.model = ProGradCLIP(clip, tokenizer, self.classnames, node, template).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    def get_class_dependent_keys(self, name):
        return ["token_prefix", "token_suffix"]

    def learnable_parameters(self):
        """The tensors the optimizers update, in order."""
        return [
            param
            for name in self.get_model_names()
            for group in self._optims[name].param_groups
            for param in group["params"]
            if param.requires_grad
        ]

    def prograd_backward_and_update(self, loss_ce, loss_kl, terms):
        """zero_grad; g_g by autograd of L_kl; backward of L_ce (the engine's non-finite check
        and scaling); per tensor g := project_conflicting(g_d, g_g, λ); one optimizer step."""
        self.model_zero_grad()
        both = loss_ce + loss_kl
        if not torch.isfinite(both).all():  # the engine raises, or skips the step (TRAIN.NONFINITE_LOSS)
            self.model_backward(both, terms)
            self.model_update()
            return
        params = self.learnable_parameters()
        scaler = self.amp.scaler
        kl = loss_kl if scaler is None else scaler.scale(loss_kl)
        kl_grads = torch.autograd.grad(kl, params, retain_graph=True, allow_unused=True)
        self.model_backward(loss_ce, terms)
        lam = self.cfg.TRAINER.PROGRAD.LAMBDA
        with torch.no_grad():
            for param, grad_kl in zip(params, kl_grads):
                if param.grad is not None and grad_kl is not None:
                    param.grad = project_conflicting(param.grad, grad_kl, lam)
        self.model_update()

    def forward_backward(self, batch):
        images, labels = self.parse_batch_train(batch)
        with self.autocast():
            loss_ce, loss_kl, logits = self.model.losses(images, labels)
        terms = {"xe_loss": loss_ce.detach(), "kl_loss": loss_kl.detach()}
        self.prograd_backward_and_update(loss_ce, loss_kl, terms)
        summary = step_summary(loss_ce, {"kl_loss": loss_kl}, compute_accuracy(logits, labels)[0])
        if (self.batch_idx + 1) == self.num_batches:
            self.update_lr()
        return summary
