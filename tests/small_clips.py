"""The smallest CLIP a registry-wide contract runs a case on (tests/test_compile.py,
tests/test_mixed_precision.py): a random CLIP of the suite's tiny shape with one block per tower
(``one_block_clip``) when the case's trainer builds there, else the synthetic CLIP (6 image and 4 text
blocks) that the case's config is written for. A trainer refuses a CLIP its config does not fit with a
ConfigError while it is built (prompts deeper than one block, DeAR's role map of the synthetic CLIP,
adapters or representation layers beyond the towers), so a new trainer finds its CLIP without a list.

What these contracts check is the trainer's step (that it traces, that it keeps its precision), whose
cost grows with the blocks it runs through: a block of the synthetic CLIP is wider and there are ten.
The compile contract (tracing costs about 0.3 s of CPU per block) goes further down a ladder of CLIPs of
the tiny shape (``clip_ladder``): one block per tower, then just deep enough for the deeper prompts,
adapters and representation layers that the configs ask for (3 image and 3 text blocks: MaPLe, ATPrompt+MaPLe,
DePT, SkipTuning, TCP; 4 and 3: IVLP, PromptSRC, PromptKD, RAdaPrompt, TAC; 4 and 4: MMRL, MMRLpp; 6 and 4: MMA,
ProVP, VPT), then the synthetic CLIP (DeAR's role map).
"""
import tempfile

import pytest

from vlprompt.config import ConfigError
from vlprompt.testing import tiny_clip_config, write_tiny_clip
from vlprompt_app.benchmarking import mixed_precision


ONE_BLOCK_CLIP_CONFIG = tiny_clip_config(1, 1)
# (image blocks, text blocks) of the ladder's deeper rungs, cheapest to trace first
DEEPER_RUNGS = ((3, 3), (4, 3), (4, 4), (6, 4))


@pytest.fixture(scope="module")
def one_block_clip(tmp_path_factory):
    """(config, weights) of a random CLIP of the suite's tiny shape (vlprompt.testing.TINY_CLIP_CONFIG)
    with one block per tower."""
    return write_tiny_clip(str(tmp_path_factory.mktemp("one_block_clip")), name="tiny-clip-one-block",
                           config=ONE_BLOCK_CLIP_CONFIG)


def backbone_opts(clip):
    """The KEY VALUE options that put a case on ``clip`` (config, weights)."""
    return "MODEL.BACKBONE.NAME", clip[0], "MODEL.BACKBONE.WEIGHTS", clip[1]


def smallest_fitting_clip(case, clip):
    """``backbone_opts(clip)`` when the trainer of ``case`` builds on ``clip``, else () (the synthetic CLIP of
    its config)."""
    with tempfile.TemporaryDirectory(prefix="fits_") as folder:
        try:
            mixed_precision.build_trainer(case, "fp32", "cpu", folder, opts=backbone_opts(clip))
        except ConfigError:
            return ()
    return backbone_opts(clip)


@pytest.fixture(scope="module")
def clip_ladder(one_block_clip, tmp_path_factory):
    """``backbones`` for compiled.check_case: ``backbone_opts`` of ``one_block_clip``, of random CLIPs of the tiny
    shape with the DEEPER_RUNGS' blocks, then () (the synthetic CLIP of the case's config)."""
    folder = str(tmp_path_factory.mktemp("clip_ladder"))
    deeper = [write_tiny_clip(folder, name=f"tiny-clip-{image}-{text}-blocks", config=tiny_clip_config(image, text))
              for image, text in DEEPER_RUNGS]
    return tuple(backbone_opts(clip) for clip in [one_block_clip] + deeper) + ((),)
