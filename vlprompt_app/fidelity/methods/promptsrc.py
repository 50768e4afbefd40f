"""PromptSRC against muzairkhattak/PromptSRC's trainers/promptsrc.py: timed only (one training step of
each side). The prompted forward is compared through PromptKD's fixture, whose teacher is the
official PromptSRC model of zhengli97/PromptKD.

Upstream's step runs only in fp16, its recipe: its forward multiplies the zero-shot image
features (the model's dtype) with the frozen text features cast to half, which fails in fp32 and
under CPU fp16 (CPU LayerNorm refuses half weights); so it is timed on CUDA (``--device cuda
--prec recipe``)."""
from ..spec import CostSpec, MethodSpec

# upstream's train.py defaults with configs/trainers/PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml over them
NODE = {"N_CTX_VISION": 4, "N_CTX_TEXT": 4, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH_VISION": 9,
        "PROMPT_DEPTH_TEXT": 9, "TEXT_LOSS_WEIGHT": 25, "IMAGE_LOSS_WEIGHT": 10, "GPA_MEAN": 15, "GPA_STD": 1}
UNPROMPTED = {"trainer": "IVLP", "vision_depth": 0, "language_depth": 0, "vision_ctx": 0, "language_ctx": 0}

SPECS = (
    MethodSpec(
        name="PromptSRC",
        repository="muzairkhattak/PromptSRC",
        fixture="",
        compared_by="PromptKD (its fixture's teacher is the official PromptSRC model)",
        official_module="trainers.promptsrc",
        official_cfg={"TRAINER.PROMPTSRC": dict(NODE)},
        dataset="OxfordPets",
        cost=CostSpec(trainer="PromptSRC", train_cfg={"OPTIM.MAX_EPOCH": 20}, plain_design=UNPROMPTED,
                      our_nodes={}, recipe_only=True, gpu_acceptance=True),
    ),
)
