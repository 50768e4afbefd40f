"""CoOp against KaiyangZhou/CoOp's trainers/coop.py: logits [B, C] and the batch's cross-entropy."""
from .common import run_official_logits_and_ce, run_ours_logits_and_ce

NODE = {"N_CTX": 16, "CSC": False, "CTX_INIT": "", "CLASS_TOKEN_POSITION": "end", "PREC": "fp32"}


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.coop import CoOpCLIP

    return CoOpCLIP(clip, tokenizer, classnames, node)


SPECS = {
    "CoOp": {
        "repository": "KaiyangZhou/CoOp",
        "code_dir": "",
        "official_module": "trainers.coop",
        "official_trainer": "CoOp",
        "official_cfg": {"TRAINER.COOP": dict(NODE)},
        "our_node": dict(NODE),
        "learnables": {"prompt_learner.ctx": {"official": "prompt_learner.ctx", "init_std": 0.02}},
        "outputs": ("logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours_logits_and_ce,
        "run_official": run_official_logits_and_ce,
    },
}
