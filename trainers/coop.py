"""CoOp: Context Optimization (Zhou et al., IJCV 2022).

A shared (or class-specific) context of n learnable vectors replaces the words of the
prompt "X X ... X <class>." in front of (or around) the class name; CLIP stays frozen.
logits = 100 * cos(image feature, text feature of the prompt); loss = cross-entropy.

Compared by running KaiyangZhou/CoOp @ ff61507c (Dassl.pytorch @ c61a1b57), its CustomCLIP in
fp32, on a seeded random ViT-B/16 and a context at 10x its init std: logits and one batch's CE
agree (tools/official_equivalence.py, fixture tests/fixtures/official/coop.json,
tests/test_fidelity.py; the relative max differences are in docs/fidelity.md).

The model (``CoOpCLIP``) and its node ``TRAINER.COOP`` are the text-context family
(vlprompt/methods/text_context.py), which other methods build on.
"""
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case
from vlprompt.methods.text_context import CoOpCLIP


@TRAINER_REGISTRY.register()
class CoOp(ClipTrainer):
    """CoOp trainer; the checkpointed module is the prompt learner (the context)."""

    benchmark_cases = (
        Case("CoOp/vit_b16_ep50_ctxv1.yaml", TRAIN, train_target=2.6, official_train=5.2,
             official_eval=OFFICIAL_EVAL),
    )

    exports_class_text_features = True

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = CoOpCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.COOP).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    def get_class_dependent_keys(self, name):
        # Reference CoOp checkpoints also hold the class-dependent embeddings.
        return ["token_prefix", "token_suffix"]
