"""CLIP's ViT image tower driven block by block under a plan.

Images [B, 3, H, W] -> patch + class embedding with positional embedding [B, 1 + P, D]
-> the plan's embedding edits -> ``ln_pre`` -> blocks (with the plan's edits and per-head
masks [heads, L, L]) -> the class token (position 0) -> ``ln_post`` and the projection
[B, E]. Blocks before the first one the plan touches run once without autograd when their
weights are frozen; ``shared_prefix`` hands that prefix to several runs.
"""
import torch

from .attention import block_qkv
from .plan import EMPTY_PLAN, RunState
from .prefix import SharedPrefix
from .tower import Tower, TowerOutput, UnsupportedBackboneError, check_blocks

__all__ = ["VisionTower"]


class VisionTower(Tower):
    """CLIP's ViT image tower driven block by block.

    Registers open_clip's own modules and parameters (no copies).
    """

    def __init__(self, visual):
        from open_clip.transformer import VisionTransformer

        super().__init__()
        if not isinstance(visual, VisionTransformer):
            raise UnsupportedBackboneError(
                f"The image tower is a {type(visual).__name__}; the prompted runner needs a "
                "ViT CLIP image tower (methods that only need image features can use "
                "CLIPRunner.encode_image_plain)."
            )
        if visual.attn_pool is not None or visual.pool_type != "tok":
            raise UnsupportedBackboneError(
                "The prompted runner supports ViT image towers that pool the class token "
                f"(pool_type 'tok', no attention pooling); got pool_type '{visual.pool_type}'."
            )
        check_blocks(visual.transformer.resblocks, "image")
        self.conv1 = visual.conv1
        self.class_embedding = visual.class_embedding
        self.positional_embedding = visual.positional_embedding
        self.patch_dropout = visual.patch_dropout
        self.ln_pre = visual.ln_pre
        self.blocks = visual.transformer.resblocks
        self.ln_post = visual.ln_post
        self.proj = visual.proj

    @property
    def output_dim(self):
        return self.proj.shape[1]

    def embed(self, images):
        """Patch + class-token embedding with positional embedding.

        Args:
            images: [B, 3, H, W].
        Returns:
            [B, 1 + P, D], before ``ln_pre``.
        """
        x = self.conv1(images.to(self.conv1.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        return self.patch_dropout(x)

    def stem(self, images, plan=EMPTY_PLAN):
        """Embedding, the plan's embedding edits, and ``ln_pre``: input of block 0."""
        x = self.embed(images)
        for edit in plan.embed:
            x = edit(x, RunState())
        return self.ln_pre(x)

    def project(self, tokens):
        """``ln_post`` then the frozen projection: [..., D] -> [..., E]."""
        return self.ln_post(tokens) @ self.proj

    def forward(self, images=None, plan=EMPTY_PLAN, hidden=None, start=0, rows=None, prefix=None):
        """Encode images, or continue from hidden states.

        Args:
            images: [B, 3, H, W] (when ``hidden`` is None).
            plan: the method's plan.
            hidden: [B, L, D] hidden states at the input of block ``start`` (e.g. a
                prefix shared between a prompted and a frozen branch).
            start: first block to run when ``hidden`` is given.
            rows: None, or the token positions the last block computes, starting with
                the class token 0 (e.g. ``[0]``, or ``[0]`` plus appended prompt tokens):
                the other positions' final states are skipped, which is exact for them.
            prefix: a SharedPrefix to continue from (instead of ``hidden`` and ``start``);
                the plan's edits at ``prefix.start`` must keep its N tokens first.

        Returns:
            TowerOutput with features [B, E] (class token) and final tokens ([B, L, D],
            or [B, R, D] in the order of ``rows``).
        """
        if rows is not None and (len(rows) == 0 or int(rows[0]) != 0):
            raise ValueError(f"rows must start with the class token position 0, got {list(rows)}.")
        known = None
        if prefix is not None:
            if hidden is not None:
                raise ValueError("Give the image tower hidden states or a SharedPrefix, not both.")
            prefix.check_plan(plan)
            hidden, start, known = prefix.hidden, prefix.start, prefix.qkv
        elif hidden is None:
            first = plan.first_layer(self.num_layers)
            if first < 0:
                hidden = self.stem(images, plan)
            else:
                start = min(first, self.num_layers - 1)  # the last block computes ``rows`` only
                hidden = self.run_prefix(images, start)
        x = self.run_blocks(hidden, start, self.num_layers, plan, rows=rows, known=known)
        return TowerOutput(features=self.project(x[:, 0]), tokens=x)

    def run_prefix(self, images, stop):
        """Hidden states [B, 1 + P, D] at the input of block ``stop`` of the unmodified
        tower. Runs without autograd when the prefix weights are frozen."""
        stop = min(stop, self.num_layers)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self._prefix_frozen(stop)):
            return self.run_blocks(self.stem(images), 0, stop)

    def shared_prefix(self, images, start):
        """``run_prefix`` plus block ``start``'s q, k, v of it: a SharedPrefix for several
        runs from ``start`` (no autograd when the weights up to that block are frozen)."""
        hidden = self.run_prefix(images, start)
        if start >= self.num_layers:
            return SharedPrefix(hidden, start)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self._prefix_frozen(start + 1)):
            return SharedPrefix(hidden, start, block_qkv(self.blocks[start], hidden))

    def _prefix_frozen(self, stop):
        return not any(p.requires_grad for p in self._stem_parameters()) and not any(
            p.requires_grad for block in self.blocks[:stop] for p in block.parameters()
        )

    def _stem_parameters(self):
        yield from self.conv1.parameters()
        yield self.class_embedding
        yield self.positional_embedding
        yield from self.ln_pre.parameters()
