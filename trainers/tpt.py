"""TPT: Test-time Prompt Tuning (Shu et al., NeurIPS 2022), alone and on a trained CoOp, CoCoOp or MaPLe.

Per test image, independently (an episode of vlprompt.engine.test_time):

1. V = 64 views: the test view (resize, centre crop) + 63 random resized crops (scale 0.08-1,
   bilinear) with flips (AugMix on top for the non-ImageNet sets, TRAINER.TPT.AUGMIX);
2. logits p_v of every view with the current prompt; keep the 10 % of views with the lowest
   entropy (6 of 64);
3. L = H(mean_v softmax(p_v)) over the kept views (entropy of the averaged probability);
   one AdamW step (lr 5e-3, weight decay 0.01) on the prompt, the optimizer fresh per image;
4. predict the test view with the tuned prompt; reset the prompt before the next image.

The prompt being tuned (TRAINER.TPT.PROMPT) and the model around it:

* ``coop``: CoOp's text context (TRAINER.COOP; TPT: 4 tokens initialised from "a photo of a").
  Plain TPT starts from that phrase; CoOp+TPT loads a CoOp run's context (``--model-dir``,
  folder ``prompt_learner``). The image tower is not prompted, so the views are encoded once.
* ``cocoop``: a trained CoCoOp (TRAINER.COCOOP, ``--model-dir`` required). The context of the
  image, c = ctx + π(f_0), is computed once from the test view and tuned directly (ctx and the
  meta-net π stay frozen); all views are scored with that one context. As upstream, π is fed
  the test view's image feature before L2 normalisation (CoCoOp trains π on the normalised
  feature); this follows the official code (clip/cocoop.py ``gen_ctx``).
* ``maple``: a trained MaPLe (TRAINER.MAPLE, ``--model-dir``, folder ``MultiModalPromptLearner``);
  every prompt-learner parameter is tuned (text prompts and couplings; PromptAlign's MaPLe+TPT).
  The views pass the prompted image tower: all of them without gradient to select, the kept
  ones again with gradient for the step (the same loss as one pass over all views).

Under fp16 the step goes through a gradient scaler created for the episode (initial scale
1000, as upstream; upstream keeps one scaler over the test set), so an image's prediction
never depends on the images before it.

Compared by running azshue/TPT @ 63ecbace (tpt_classification.py, clip/custom_clip.py,
clip/cocoop.py) in fp32 on a seeded random ViT-B/16 with the context at 10x its init std, both
sides fed the same 64 view tensors of one image (tools/official_equivalence.py TPT / TPT-CoCoOp,
vlprompt_app/fidelity/methods/tpt.py, tests/test_fidelity.py): TPT and CoCoOp+TPT
(context and meta-net drawn away from their inits) keep the same 6 views, and the loss, the
context after the AdamW step and the test-view logits agree (relative max differences in
docs/fidelity.md). MaPLe+TPT has no official TPT code (PromptAlign's trainer is its closest); it is
checked against the single pass over all views in tests/test_tpt.py.

The episode (``PromptTuning``), its trainer and its node ``TRAINER.TPT`` are the prompt-tuning
family (vlprompt/methods/prompt_tuning.py), which PromptAlign builds on.
"""
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TEST_TIME, Case
from vlprompt.methods.prompt_tuning import PromptTuningTrainer


@TRAINER_REGISTRY.register()
class TPT(PromptTuningTrainer):
    """Test-time prompt tuning; the source model (``--model-dir``) is registered as its trainer does."""

    benchmark_cases = (
        Case("TPT/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None),
        Case("TPT/vit_b16_cocoop.yaml", TEST_TIME, name="CoCoOp+TPT", batch=1, eval_target=None,
             synthetic="TPT/synthetic_cocoop.yaml"),
        Case("TPT/vit_b16_maple.yaml", TEST_TIME, name="MaPLe+TPT", batch=1, eval_target=None,
             synthetic="TPT/synthetic_maple.yaml"),
    )
