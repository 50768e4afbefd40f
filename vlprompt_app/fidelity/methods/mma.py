"""MMA against ZjjConan/Multi-Modal-Adapter's trainers/mmadapter.py: logits [B, C] and CE, with
every adapter weight and bias (zero at init) drawn non-zero.

Two cases: ``MMA`` (the recipe's scale 0.001, values at 10x their init std) and ``MMA-scale0.1``
(scale 0.1, values at their init std, the biases at 0.02), where the adapters move the logits by
a few percent ("adapters removed" must fail at 1e-2) and both sides, in fp32, agree to about 2e-7.
Relative logit differences near 1e-3 at scale 0.1 are half-precision rounding, not the method:
our model under fp16 autocast differs from its own fp32 logits by about 1.2e-3 on this fixture
(bf16 about 4e-3), while a scale of 0.09 or the adapters one block early fail the 3e-3 contract.
"""
import re

from ..spec import LEARNABLE_SCALE, CostSpec, Learnable, MethodSpec, Mutation
from .common import reversed_rows, run_official_logits_and_ce, run_ours_logits_and_ce

NODE = {"TEXT_CTX_INIT": "a photo of a", "PREC": "fp32", "ADAPTER_START": 5, "ADAPTER_END": 12, "ADAPTER_DIM": 32,
        "ADAPTER_SCALE": 0.001}
# Scale 0.1 with the adapters drawn at their official init std (biases at 0.02): each adapter's
# branch is then a few percent of its block's residual update, and it moves the logits.
NODE_SCALE_01 = dict(NODE, ADAPTER_SCALE=0.1)


def adapter_learnables(start=5, end=12, text_width=512, vision_width=768, dim=32, gain=1.0):
    """The adapters of ViT-B/16, our name -> {official name, shape, init std}: Kaiming-normal
    (fan_out, ReLU) weights, std sqrt(2 / out_features); the biases, zero at init, get std 0.02.
    Every std is multiplied by ``gain`` (1 / LEARNABLE_SCALE: values drawn at the official init std)."""
    entries = {}
    for layer in range(start, end + 1):
        for ours, official, width in (("text", "text_adapter", text_width), ("visual", "visual_adapter", vision_width)):
            for part, shape in (("down.0", (dim, width)), ("up", (width, dim))):
                for kind, kind_shape, std in (("weight", shape, (2 / shape[0]) ** 0.5), ("bias", shape[:1], 0.02)):
                    entries[f"adapter_learner.{ours}.{layer}.{part}.{kind}"] = Learnable(
                        f"adapter_learner.{official}.{layer}.{part}.{kind}", gain * std, kind_shape)
        for kind, shape, std in (("weight", (dim, dim), (2 / dim) ** 0.5), ("bias", (dim,), 0.02)):
            entries[f"adapter_learner.shared.{layer}.0.{kind}"] = Learnable(
                f"adapter_learner.shared_adapter.{layer}.0.{kind}", gain * std, shape)
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.mma import MMACLIP

    return MMACLIP(clip, tokenizer, classnames, node)


def zeroed(learnables):
    """Every adapter value zero: the frozen CLIP's logits (the adapters' effect on the logits)."""
    return {name: value.new_zeros(value.shape) for name, value in learnables.items()}


def one_block_early(learnables):
    """The same adapter values one block earlier (block b's under b - 1), with ADAPTER_START/END 4/11."""
    return {re.sub(r"\.(\d+)\.", lambda m: f".{int(m.group(1)) - 1}.", name, count=1): value
            for name, value in learnables.items()}


MISPLACEMENTS = (Mutation("learnable rows in reverse order", values=reversed_rows),
                 Mutation("adapters one block early", values=one_block_early,
                          node={"ADAPTER_START": 4, "ADAPTER_END": 11}))


def _spec(name, node, learnables, mutations, **fields):
    """An MMA spec against the official trainers/mmadapter.py with ``node`` on both sides."""
    return MethodSpec(name=name, repository="ZjjConan/Multi-Modal-Adapter", official_module="trainers.mmadapter",
                      official_cfg={"TRAINER.MMADAPTER": dict(node)}, our_node=dict(node), learnables=learnables,
                      outputs=("logits", "loss"), build_ours=build_ours, run_ours=run_ours_logits_and_ce,
                      run_official=run_official_logits_and_ce, mutations=mutations, **fields)


SPECS = (
    _spec("MMA", NODE, adapter_learnables(), MISPLACEMENTS, cost=CostSpec(trainer="MultiModalAdapter")),
    _spec("MMA-scale0.1", NODE_SCALE_01, adapter_learnables(gain=1 / LEARNABLE_SCALE),
          MISPLACEMENTS + (Mutation("adapter scale 0.09", node={"ADAPTER_SCALE": 0.09}),
                           Mutation("adapters removed", values=zeroed, threshold=0.01)),
          fixture="mma-scale0.1"),
)
