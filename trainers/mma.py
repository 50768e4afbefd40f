"""MMA: Multi-Modal Adapter (Yang et al., CVPR 2024).

Frozen CLIP with a parallel adapter beside each block l = ADAPTER_START..ADAPTER_END (1-based;
5..12 for ViT-B/16) of both towers, the middle layer shared by the two towers:

    text  block l:  D_t^l: Linear(D_t -> r) + ReLU,  U_t^l: Linear(r -> D_t)    (D_t 512)
    image block l:  D_v^l: Linear(D_v -> r) + ReLU,  U_v^l: Linear(r -> D_v)    (D_v 768)
    shared:         S^l: Linear(r -> r) + ReLU, the SAME module in both towers   (r = ADAPTER_DIM = 32)

    x <- x + Attn(LN_1 x) + MLP(LN_2 x') + s · U^l(S^l(D^l(LN_1 x))),   x' = x + Attn(LN_1 x)

with x [N, L, D] the block's input and s = ADAPTER_SCALE = 0.001. The branch is the runner's
``Plan.parallel`` hook: it reads the block's LN_1 output and is added after the MLP residual.
Every Linear is Kaiming-normal (fan_out, ReLU gain) with zero bias. ViT-B/16: 674,560 learnable
parameters (as ``tools/benchmark.py trainers --trainers MMA`` counts them).

Gradient scale: the branch is g_{1/s}(s · U(S(D(g_s(LN_1 x))))), where g_a is the identity
forward and multiplies the incoming gradient by a backward. The forward is unchanged; every
adapter parameter (between the two layers) gets 1/s times (1000x) the gradient plain autograd
gives, while the gradient reaching the hidden states is plain autograd's (1/s · s = 1). With
SGD at the official lr 1.5e-3, plain gradients would leave the adapters almost untouched.
g_s is applied to LN_1's output here and to LN_1's input upstream: LN's backward is linear in
its incoming gradient, so the gradients are the same (LN_1 is frozen).

Text: the fixed sentence "a photo of a {class}." (TEXT_CTX_INIT + " {}."), through the adapted
text tower: t [C, E]; image: the adapted image tower f [B, E]; logits = s_CLIP · f̂ · t̂ᵀ,
loss = CE. Class text features are recomputed every training step and computed once per
evaluation (PromptedCLIP's evaluation cache, as upstream's ``text_features_for_inference``).

Towers of different depths (the synthetic benchmark's tiny CLIP, 6 image and 4 text blocks):
a tower gets adapters at START..min(END, its depth); S^l serves layer l of every tower that has
it. The configuration must adapt at least one layer of each tower.

Verified by reading the official code (ZjjConan/Multi-Modal-Adapter @ 547ee345,
trainers/mmadapter.py, clip/model.py, clip/gsl.py, configs/trainers/MultiModalAdapter/):
1-based layer indices (``ModifiedResidualAttentionBlock`` gets index+1; adapters at
START..END), the shared adapter built as Linear(32 -> 32) + ReLU (its width equals
ADAPTER_DIM), down = Linear + ReLU, up = Linear without activation, kaiming_normal_(fan_out,
relu) and zero bias on every Linear, the branch g_{1/s}(up(shared(down(ln_1(g_s(x))))) · s)
added after the MLP residual, the index-0 (embedding-level) adapters unused with START 5, the
prompt TEXT_CTX_INIT + " " + name + ".", CE loss, only the adapters trained, and the cached
text features at inference. Run side by side with the official code (@ 547ee345, Dassl.pytorch
@ c61a1b57) by tools/official_equivalence.py on a seeded random ViT-B/16, 3 classes, every
adapter weight and bias drawn non-zero (weights at 10x their init std): logits and CE agree
(relative max differences in docs/fidelity.md); the same adapters one block early
(4..11) give 0.75 on the logits (tests/test_fidelity.py). At scale 0.1 with the adapters at their
init std (fixture mma-scale0.1.json) the logits agree to 2e-7, while fp16 autocast alone moves
them by about 1.2e-3. tests/test_mma.py checks
the equations above independently.
"""
import torch
import torch.nn.functional as F
from torch import nn
from yacs.config import CfgNode as CN

from vlprompt.clip import Plan, PromptedCLIP, fill_template, tower_depths
from vlprompt.config import ConfigError, check_range, register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case


@register_cfg_extension
def add_mma_config(cfg):
    cfg.TRAINER.MMA = CN()
    cfg.TRAINER.MMA.TEXT_CTX_INIT = "a photo of a"  # sentence "<TEXT_CTX_INIT> <class>."
    cfg.TRAINER.MMA.PREC = "amp"  # fp16, fp32, amp or bf16 (autocast with fp32 master weights)
    cfg.TRAINER.MMA.ADAPTER_START = 5  # first adapted block, 1-based, both towers
    cfg.TRAINER.MMA.ADAPTER_END = 12  # last adapted block, 1-based, inclusive
    cfg.TRAINER.MMA.ADAPTER_DIM = 32  # bottleneck width r
    cfg.TRAINER.MMA.ADAPTER_SCALE = 0.001  # s


class GradientScale(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def gradient_scale(x, scale):
    """x in the forward pass; its gradient times ``scale`` in the backward pass."""
    return GradientScale.apply(x, scale)


def kaiming_linear(in_features, out_features):
    """Linear with Kaiming-normal weight (fan_out, ReLU gain) and zero bias."""
    linear = nn.Linear(in_features, out_features)
    nn.init.kaiming_normal_(linear.weight, mode="fan_out", nonlinearity="relu")
    nn.init.zeros_(linear.bias)
    return linear


class Bottleneck(nn.Module):
    """One tower's adapter at one layer: down = Linear(D -> r) + ReLU, up = Linear(r -> D)."""

    def __init__(self, width, dim):
        super().__init__()
        self.down = nn.Sequential(kaiming_linear(width, dim), nn.ReLU())
        self.up = kaiming_linear(dim, width)


class MultiModalAdapters(nn.Module):
    """The adapters of both towers and the shared middle layers.

    Args:
        text_width: D_t. vision_width: D_v. text_layers, vision_layers: tower depths.
        start, end: 1-based inclusive range of adapted layers. dim: r. scale: s.

    Attributes:
        text, visual, shared: ModuleDicts keyed by the 1-based layer number as a string;
            ``shared[l]`` is Linear(r -> r) + ReLU, used by ``text[l]`` and ``visual[l]``.
    """

    def __init__(self, text_width, vision_width, text_layers, vision_layers, start, end, dim, scale):
        super().__init__()
        self.scale = scale
        self.text = nn.ModuleDict({str(l): Bottleneck(text_width, dim) for l in range(start, min(end, text_layers) + 1)})
        self.visual = nn.ModuleDict(
            {str(l): Bottleneck(vision_width, dim) for l in range(start, min(end, vision_layers) + 1)}
        )
        self.shared = nn.ModuleDict({
            str(l): nn.Sequential(kaiming_linear(dim, dim), nn.ReLU())
            for l in range(start, min(end, max(text_layers, vision_layers)) + 1)
        })

    def branch(self, tower, layer, h):
        """g_{1/s}(s · U(S(D(g_s(h))))) for h = LN_1(x) [N, L, D] of 1-based ``layer``: [N, L, D]."""
        adapter = getattr(self, tower)[str(layer)]
        y = gradient_scale(h, self.scale)
        y = adapter.up(self.shared[str(layer)](adapter.down(y))) * self.scale
        return gradient_scale(y, 1.0 / self.scale)

    def plan(self, tower):
        """The runner's Plan of ``tower`` ("text" or "visual"): branches at 0-based blocks l - 1."""
        return Plan(parallel={
            int(layer) - 1: (lambda h, layer=int(layer): self.branch(tower, layer, h))
            for layer in getattr(self, tower)
        })


class MMACLIP(PromptedCLIP):
    """Frozen CLIP with MMA's adapters in both towers and a fixed sentence per class.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names. node: cfg.TRAINER.MMA.

    Attributes:
        adapter_learner: MultiModalAdapters (the trained module).
        token_ids: buffer [C, L], the tokenized sentences (rebuilt with the class list).
    """

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.adapter_learner = MultiModalAdapters(
            clip.text.width, clip.visual.width, clip.text.num_layers, clip.visual.num_layers,
            node.ADAPTER_START, node.ADAPTER_END, node.ADAPTER_DIM, node.ADAPTER_SCALE,
        )
        template = f"{node.TEXT_CTX_INIT} {{}}."
        sentences = [fill_template(template, name) for name in classnames]
        learner = self.adapter_learner
        print(f"MMA prompts: {sentences[:3]}...; adapted layers (1-based): text {list(learner.text)}, "
              f"image {list(learner.visual)}; scale {learner.scale}")
        self.register_buffer("token_ids", tokenizer(sentences), persistent=False)

    def compute_text_features(self):
        return self.clip.encode_text(self.token_ids, self.adapter_learner.plan("text"))

    def forward(self, images):
        image_features = F.normalize(self.clip.encode_image(images, self.adapter_learner.plan("visual")), dim=-1)
        return self.cosine_logits(image_features, self.class_text_features())


@TRAINER_REGISTRY.register()
class MMA(ClipTrainer):
    """MMA trainer; the checkpointed module is ``adapter_learner`` (all adapters)."""

    benchmark_cases = (Case("MMA/vit_b16_ep5.yaml", TRAIN),)

    def check_cfg(self, cfg):
        node, backbone = cfg.TRAINER.MMA, cfg.MODEL.BACKBONE.NAME
        check_range("TRAINER.MMA.ADAPTER_DIM", node.ADAPTER_DIM, minimum=1)
        if not node.ADAPTER_SCALE > 0:
            raise ConfigError(
                f"TRAINER.MMA.ADAPTER_SCALE must be > 0 (s multiplies the adapter output and 1/s its "
                f"gradients), got {node.ADAPTER_SCALE}."
            )
        check_range("TRAINER.MMA.ADAPTER_START", node.ADAPTER_START, minimum=1, why="Layers are 1-based.")
        check_range("TRAINER.MMA.ADAPTER_END", node.ADAPTER_END, minimum=node.ADAPTER_START,
                    why="ADAPTER_END is the last adapted layer (inclusive), at least ADAPTER_START.")
        vision_layers, text_layers = tower_depths(backbone)
        if vision_layers is not None and text_layers is not None:
            shallower, deeper = sorted((vision_layers, text_layers))
            if node.ADAPTER_START > shallower or node.ADAPTER_END > deeper:
                raise ConfigError(
                    f"TRAINER.MMA.ADAPTER_START..ADAPTER_END ({node.ADAPTER_START}..{node.ADAPTER_END}, 1-based) "
                    f"must adapt layers of both towers: {backbone} has {vision_layers} image and {text_layers} "
                    f"text blocks, so ADAPTER_START <= {shallower} and ADAPTER_END <= {deeper}."
                )

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = MMACLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.MMA).to(self.device)
        self.register_learner("adapter_learner", self.model.adapter_learner)
