"""CoOp against KaiyangZhou/CoOp's trainers/coop.py: logits [B, C] and the batch's cross-entropy."""
from ..spec import CostSpec, Learnable, MethodSpec, Mutation
from .common import reversed_rows, run_official_logits_and_ce, run_ours_logits_and_ce

NODE = {"N_CTX": 16, "CSC": False, "CTX_INIT": "", "CLASS_TOKEN_POSITION": "end", "PREC": "fp32"}


def build_ours(clip, tokenizer, classnames, node, spec):
    from vlprompt.methods.text_context import CoOpCLIP

    return CoOpCLIP(clip, tokenizer, classnames, node)


SPECS = (
    MethodSpec(
        name="CoOp",
        repository="KaiyangZhou/CoOp",
        official_module="trainers.coop",
        official_cfg={"TRAINER.COOP": dict(NODE)},
        our_node=dict(NODE),
        learnables={"prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)},
        outputs=("logits", "loss"),
        build_ours=build_ours,
        run_ours=run_ours_logits_and_ce,
        run_official=run_official_logits_and_ce,
        mutations=(Mutation("learnable rows in reverse order", values=reversed_rows),),
        cost=CostSpec(trainer="CoOp", gpu_acceptance=True),
    ),
)
