"""CoCoOp: Conditional Context Optimization (Zhou et al., CVPR 2022).

CoOp's context made image-conditional: a small meta-net maps the normalised image
feature f_b to a shift pi_b, added to every context vector, so each image gets its own
prompts ctx + pi_b for all C classes. logits[b, c] = 100 cos(f_b, text(ctx + pi_b, c));
loss = cross-entropy. CLIP stays frozen.

The text tower therefore encodes B x C prompts per batch (100 x 1000 per ImageNet test
batch; the reference first builds all their embeddings, [B, C, 77, 512]). Here they are
built and encoded in chunks of at most TRAINER.COCOOP.TEXT_CHUNK_SIZE (image, class)
prompts, and in training a chunked pass is recomputed during the backward pass, so the
memory is bounded by the chunk, not by B x C. Results do not depend on the chunk size.

The model (``CoCoOpCLIP``: the context, the meta-net and the chunked encoding) and its node
``TRAINER.COCOOP`` are the conditional-context family (vlprompt/methods/conditional_context.py),
which TPT also tunes.
"""
from vlprompt.config import check_range
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import TRAIN, Case
from vlprompt.methods.conditional_context import CoCoOpCLIP


@TRAINER_REGISTRY.register()
class CoCoOp(ClipTrainer):
    """CoCoOp trainer; the checkpointed module is the prompt learner (context + meta-net)."""

    benchmark_cases = (
        Case("CoCoOp/vit_b16_c4_ep10_batch1_ctxv1.yaml", TRAIN, batch=1, train_target=8.5, eval_target=4.0,
             official_train=17.0, official_eval="8"),
    )

    def check_cfg(self, cfg):
        node = cfg.TRAINER.COCOOP
        if not node.CTX_INIT:  # with an init phrase, n is its number of words
            check_range("TRAINER.COCOOP.N_CTX", node.N_CTX, minimum=1)
        check_range("TRAINER.COCOOP.TEXT_CHUNK_SIZE", node.TEXT_CHUNK_SIZE, minimum=1)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = CoCoOpCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.COCOOP).to(self.device)
        self.register_learner("prompt_learner", self.model.prompt_learner)

    def get_class_dependent_keys(self, name):
        # Reference CoCoOp checkpoints also hold the class-dependent embeddings.
        return ["token_prefix", "token_suffix"]
