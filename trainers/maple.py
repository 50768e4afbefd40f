"""MaPLe: Multi-modal Prompt Learning (Khattak et al., CVPR 2023).

Text prompts are learned; the vision prompts are derived from them by coupling
functions, V_k = F_k(T_k) with F_k: Linear(D_t -> D_v), for every prompted layer
k = 1..J. T_1 [n, D_t] starts from the first n tokens of "a photo of a" (n = 2: "a photo",
"of a" stays as fixed tokens before the class name), T_2..T_J ~ N(0, 0.02); F_2..F_J
start as identical copies of one default-initialised Linear, F_1 is a separate one.
Gradients reach the text prompts through both towers. logits = 100 cos(image, text);
loss = cross-entropy; CLIP stays frozen.

Run side by side with the official MaPLe code as kept in Koorye/DePT @ d4ff4168
(trainers/maple.py, with Dassl.pytorch @ c61a1b57; tools/official_equivalence.py MaPLe) on a
seeded random ViT-B/16 with T_1..T_9 and F_1..F_9 drawn away from their inits: logits and CE
agree (tests/test_fidelity.py; relative max differences in docs/fidelity.md).

The model (``MaPLeCLIP``: the learner of T_k and F_k and the towers' plans) and its node
``TRAINER.MAPLE`` are the coupled-prompts family (vlprompt/methods/coupled_prompts.py), which
other methods build on.
"""
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import OFFICIAL_EVAL, TRAIN, Case
from vlprompt.methods.coupled_prompts import MaPLeCLIP, check_maple_cfg


@TRAINER_REGISTRY.register()
class MaPLe(ClipTrainer):
    """MaPLe trainer; the whole model is registered (as the reference) under "MultiModalPromptLearner"."""

    benchmark_cases = (
        Case("MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml", TRAIN, train_target=3.5, official_train=7.1,
             official_eval=OFFICIAL_EVAL),
    )

    def check_cfg(self, cfg):
        check_maple_cfg(cfg)

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = MaPLeCLIP(clip, tokenizer, self.classnames, self.cfg.TRAINER.MAPLE).to(self.device)
        self.register_learner("MultiModalPromptLearner", self.model)

    def get_class_dependent_keys(self, name):
        # Reference checkpoints also hold the class-dependent embeddings.
        return ["prompt_learner.token_prefix", "prompt_learner.token_suffix"]
