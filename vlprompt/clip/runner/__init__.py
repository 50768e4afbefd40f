"""The prompted runner: CLIP's frozen towers, run block by block with per-layer edits.

Every method of the project is built on this module. CLIP's two towers are the same
thing: token embeddings -> residual blocks -> a pooled token -> a projection. Methods
differ only in what they do between blocks and inside attention, which a :class:`Plan`
describes:

* ``plan.embed``: edits of the embedded sequence before the tower's first fixed step.
  Text: the token embeddings before the positional embedding is added (CoOp's context
  gets positional embeddings). Vision: the sequence after the positional embedding and
  before ``ln_pre`` (first-layer VPT/IVLP prompts are appended there, without
  positional embedding).
* ``plan.layers[i]``: edits at the input of block ``i`` (0-based block index), e.g.
  deep prompts replacing tokens, DeAR's tokens inserted at layer J and re-mixed after.
* ``plan.masks[i]``: an additive attention mask for block ``i``, shape [heads, L, L] or
  [L, L] (0 = allowed, -inf = blocked), broadcast over the batch and never expanded per
  image. The text tower adds its causal mask to it.
* ``plan.parallel[i]``: a branch beside block ``i``, ``branch(ln_1(x)) -> [B, L, D]``,
  added to the block's output (MMA's adapters).

Blocks before the first layer the plan touches run without autograd when their
weights are frozen, and for text the hidden state there is cached per token-id tensor,
so a fixed class list costs its prefix once. ``VisionTower.shared_prefix`` returns an
image prefix together with the next block's q, k, v of it (:class:`SharedPrefix`), for
several runs from that block (DeAR's prompted pass and its regulariser's frozen branch).
The text tower computes only positions 0..max(eot) of a batch (see ``text``). The frozen
weights are used as they are: attention calls the block's own projections through
``scaled_dot_product_attention``.

Modules:

* ``plan``: the edits (InsertTokens, ReplaceTokens, MapTokens), Plan and RunState.
* ``blocks``: one residual block of any family (BlockOps per family, run_block) with an additive
  per-head mask, computing only some query rows or reusing known q, k, v (block_qkv).
* ``tower``: the block loop both towers share, TokenLayout, RotaryTable, TowerOutput,
  UnsupportedBackboneError.
* ``vision`` / ``timm_vision`` / ``text``: the towers (VisionTower and OpenCLIPVisionTower;
  TimmViTVisionTower and EvaVisionTower; TextTower).
* ``prefix``: frozen-prefix reuse (SharedPrefix for images, the text prefix cache).
* ``clip_runner``: CLIPRunner, the two towers plus the logit scale and bias; vision_tower, the
  adapter of an image tower.
"""

from .blocks import BlockOps, run_block
from .clip_runner import CLIPRunner, vision_tower
from .plan import EMPTY_PLAN, InsertTokens, MapTokens, Plan, ReplaceTokens, RunState
from .prefix import SharedPrefix
from .text import TextTower
from .tower import TokenLayout, TowerOutput, UnsupportedBackboneError
from .vision import VisionTower

__all__ = [
    "InsertTokens", "ReplaceTokens", "MapTokens", "Plan", "EMPTY_PLAN", "RunState", "TowerOutput", "TokenLayout",
    "SharedPrefix", "VisionTower", "TextTower", "CLIPRunner", "BlockOps", "run_block", "vision_tower",
    "UnsupportedBackboneError",
]
