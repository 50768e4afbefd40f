"""Image towers driven block by block under a plan.

Images [B, 3, H, W] -> the family's stem (patch embedding, prefix tokens, positions)
[B, prefix + P, D] -> the plan's embedding edits -> the pre-block norm -> blocks (with the
plan's edits and per-head masks [heads, L, L]) -> the family's pooling and projection [B, E].
Blocks before the first one the plan touches run once without autograd when their weights
are frozen; ``shared_prefix`` hands that prefix to several runs.

:class:`VisionTower` is what every family shares (the run, frozen prefixes, rows); a family
subclass gives the stem, the pooling head and the token layout. :class:`OpenCLIPVisionTower`
is open_clip's ``VisionTransformer`` (OpenAI, LAION, MetaCLIP, DFN weights); the timm towers
(SigLIP, EVA02, PE-Core) are in ``timm_vision``.
"""
import torch

from .blocks import OpenCLIPBlockOps
from .plan import EMPTY_PLAN, RunState
from .prefix import SharedPrefix
from .tower import TokenLayout, Tower, TowerOutput, UnsupportedBackboneError, open_clip_blocks

__all__ = ["VisionTower", "OpenCLIPVisionTower", "frozen_layer_norm", "take"]


def take(x, positions):
    """x[:, positions] of [B, L, D]: a view for a range of consecutive positions, else a copy."""
    if isinstance(positions, range) and positions.step == 1:
        return x[:, positions.start:positions.stop]
    return x[:, list(positions)]


def frozen_layer_norm(norm, x):
    """``norm`` (a LayerNorm, or an identity) with the statistics of ``x`` [..., D] frozen: a
    function of terms broadcastable to ``x`` that is affine in them and equals ``norm(x)`` at x."""
    if isinstance(norm, torch.nn.Identity):
        return norm
    if not isinstance(norm, torch.nn.LayerNorm):
        raise UnsupportedBackboneError(
            f"The tower normalises with {type(norm).__name__}; decompositions freeze LayerNorm statistics only.")
    sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)

    def apply(t):
        t = (t - t.mean(dim=-1, keepdim=True)) / sigma
        t = t if norm.weight is None else t * norm.weight
        return t if norm.bias is None else t + norm.bias

    return apply


class VisionTower(Tower):
    """An image tower driven block by block (one subclass per family).

    Subclasses register the family's own modules (no copies) and implement ``embed``,
    ``pre_norm``, ``pool``, ``token_features``, ``projection`` and the parameter groups.

    Attributes:
        layout: the TokenLayout of the unmodified tower.
    """

    layout: TokenLayout

    @property
    def output_dim(self):
        """E, the dimension of the features."""
        raise NotImplementedError

    def embed(self, images):
        """[B, 3, H, W] -> [B, prefix + P, D]: patch and prefix tokens with their positions,
        before the pre-block norm (where ``Plan.embed`` edits act)."""
        raise NotImplementedError

    def pre_norm(self, x):
        """The norm before block 0 (identity where the family has none)."""
        raise NotImplementedError

    def pool(self, x, state, pool_keys=None):
        """Pooled, projected features [B, E] from the last block's output ``x`` [B, L, D].

        Args:
            state: the run's RunState (where the patches are).
            pool_keys: an attention-pool tower pools these positions only (default: the whole
                sequence, prompt tokens included); ignored by class-token and average pooling.
        """
        raise NotImplementedError

    def token_features(self, tokens, projection=None):
        """Each token [..., D] taken through the tower's head as if it were the pooled one:
        [..., E]. ``projection`` [D', E'] replaces the head's final linear map
        (``self.projection``; the identity where the head has none), e.g. a learnable copy."""
        raise NotImplementedError

    @property
    def projection(self):
        """The head's final linear map as a matrix [D', E] (frozen; a view of the weight), or
        None when the head ends without one."""
        raise NotImplementedError

    @property
    def projection_input_dim(self):
        """D': the width the head's final linear map reads (E where the head has none)."""
        projection = self.projection
        return self.output_dim if projection is None else projection.shape[0]

    def projection_or_identity(self):
        """``projection`` [D', E], or the identity [E, E] where the head has no final linear map: what a
        method copies to learn a projection of its own tokens (``token_features(tokens, copy)``)."""
        projection = self.projection
        if projection is not None:
            return projection
        anchor = next(self.blocks[0].parameters())
        return torch.eye(self.output_dim, dtype=anchor.dtype, device=anchor.device)

    def readout(self, x, state=None):
        """The pooling head of final hidden states ``x`` [B, L, D] as an affine map, for
        decompositions: (positions, affine) where ``positions`` are the P positions the head
        reads and ``affine(t)`` maps per-position terms t [B, P, X, D] to [B, X, E] with this
        image's statistics frozen (its norms' means and deviations, its attention pool's
        weights, its pool MLP's output), so that ``affine(x[:, positions, None])[:, 0]`` is the
        pooled feature and ``affine(t) - affine(0)`` is linear in t."""
        raise NotImplementedError

    def stem_parameters(self):
        """Parameters before block 0 (embeddings, pre-block norm)."""
        raise NotImplementedError

    def head_parameters(self):
        """Parameters after the last block (final norm, pooling head, projection)."""
        raise NotImplementedError

    def initial_state(self):
        return RunState(patches=self.layout.prefix_tokens)

    def stem(self, images, plan=EMPTY_PLAN, state=None):
        """Embedding, the plan's embedding edits, and the pre-block norm: input of block 0."""
        state = state or self.initial_state()
        x = self.embed(images)
        for edit in plan.embed:
            x = edit(x, state)
        return self.pre_norm(x)

    def forward(self, images=None, plan=EMPTY_PLAN, hidden=None, start=0, rows=None, prefix=None, pool_keys=None):
        """Encode images, or continue from hidden states.

        Args:
            images: [B, 3, H, W] (when ``hidden`` is None).
            plan: the method's plan.
            hidden: [B, L, D] hidden states at the input of block ``start`` (e.g. a prefix
                shared between a prompted and a frozen branch), patches where the unmodified
                tower has them.
            start: first block to run when ``hidden`` is given.
            rows: None (``tokens`` holds every position), or the positions whose final states
                ``tokens`` holds ([B, R, D] in this order, e.g. appended prompt tokens; ``()``
                for none). A class-token tower's last block then computes the class token and
                these rows only, which is exact for them.
            prefix: a SharedPrefix to continue from (instead of ``hidden`` and ``start``);
                the plan's edits at ``prefix.start`` must keep its N tokens first.
            pool_keys: see ``pool``.

        Returns:
            TowerOutput with the pooled features [B, E] and final tokens.
        """
        known = None
        state = self.initial_state()
        if prefix is not None:
            if hidden is not None:
                raise ValueError("Give the image tower hidden states or a SharedPrefix, not both.")
            prefix.check_plan(plan)
            hidden, start, known = prefix.hidden, prefix.start, prefix.qkv
        elif hidden is None:
            first = plan.first_layer(self.num_layers)
            if first < 0:
                hidden = self.stem(images, plan, state)
            else:
                start = min(first, self.num_layers - 1)  # the last block may compute some rows only
                hidden = self.run_prefix(images, start)
        if self.layout.pooling != "token":
            x = self.run_blocks(hidden, start, self.num_layers, plan, state, known=known)
            return TowerOutput(features=self.pool(x, state, pool_keys), tokens=x if rows is None else take(x, rows))
        if rows is None:
            x = self.run_blocks(hidden, start, self.num_layers, plan, state, known=known)
            return TowerOutput(features=self.pool(x, state), tokens=x)
        rows = list(rows)
        with_class = bool(rows) and int(rows[0]) == 0  # the class token asked for: computed once
        last_rows = rows if with_class else [0, *rows]
        x = self.run_blocks(hidden, start, self.num_layers, plan, state, rows=last_rows, known=known)
        return TowerOutput(features=self.pool(x[:, :1], state), tokens=x if with_class else x[:, 1:])

    def run_prefix(self, images, stop):
        """Hidden states [B, prefix + P, D] at the input of block ``stop`` of the unmodified
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
            return SharedPrefix(hidden, start, self.block_qkv(start, hidden))

    def _prefix_frozen(self, stop):
        return not any(p.requires_grad for p in self.stem_parameters()) and not any(
            p.requires_grad for block in self.blocks[:stop] for p in block.parameters()
        )


class OpenCLIPVisionTower(VisionTower):
    """open_clip's ViT image tower (``VisionTransformer``, class-token pooling): patches and the
    class embedding with learned positions, ``ln_pre``, ``ResidualAttentionBlock`` s, the class
    token through ``ln_post`` and ``proj``.

    Registers open_clip's own modules and parameters (no copies).
    """

    ops = OpenCLIPBlockOps()

    def __init__(self, visual):
        super().__init__()
        if visual.attn_pool is not None or visual.pool_type != "tok":
            raise UnsupportedBackboneError(
                "The prompted runner supports open_clip ViT image towers that pool the class token "
                f"(pool_type 'tok', no attention pooling); got pool_type '{visual.pool_type}'."
            )
        blocks = open_clip_blocks(visual.transformer, "image")
        self.conv1 = visual.conv1
        self.class_embedding = visual.class_embedding
        self.positional_embedding = visual.positional_embedding
        self.patch_dropout = visual.patch_dropout
        self.ln_pre = visual.ln_pre
        self.blocks = blocks
        self.ln_post = visual.ln_post
        self.proj = visual.proj
        self.layout = TokenLayout(prefix_tokens=1, num_patches=visual.positional_embedding.shape[0] - 1,
                                  pooling="token")

    @property
    def output_dim(self):
        return self.proj.shape[1]

    def embed(self, images):
        x = self.conv1(images.to(self.conv1.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        return self.patch_dropout(x)

    def pre_norm(self, x):
        return self.ln_pre(x)

    def pool(self, x, state, pool_keys=None):
        return self.token_features(x[:, 0])

    def token_features(self, tokens, projection=None):
        return self.ln_post(tokens) @ (self.proj if projection is None else projection)

    @property
    def projection(self):
        return self.proj

    def readout(self, x, state=None):
        norm = frozen_layer_norm(self.ln_post, x[:, [0], None])
        return [0], lambda t: (norm(t) @ self.proj)[:, 0]

    def stem_parameters(self):
        yield from self.conv1.parameters()
        yield self.class_embedding
        yield self.positional_embedding
        yield from self.ln_pre.parameters()

    def head_parameters(self):
        yield from self.ln_post.parameters()
        yield self.proj
