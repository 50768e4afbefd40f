"""MMA against ZjjConan/Multi-Modal-Adapter's trainers/mmadapter.py: logits [B, C] and CE, with
every adapter weight and bias (zero at init) drawn non-zero."""
from .common import run_official_logits_and_ce, run_ours_logits_and_ce

NODE = {"TEXT_CTX_INIT": "a photo of a", "PREC": "fp32", "ADAPTER_START": 5, "ADAPTER_END": 12, "ADAPTER_DIM": 32,
        "ADAPTER_SCALE": 0.001}


def adapter_learnables(start=5, end=12, text_width=512, vision_width=768, dim=32):
    """The adapters of ViT-B/16, our name -> {official name, shape, init std}: Kaiming-normal
    (fan_out, ReLU) weights, std sqrt(2 / out_features); the biases, zero at init, get std 0.02."""
    entries = {}
    for layer in range(start, end + 1):
        for ours, official, width in (("text", "text_adapter", text_width), ("visual", "visual_adapter", vision_width)):
            for part, shape in (("down.0", (dim, width)), ("up", (width, dim))):
                for kind, kind_shape, std in (("weight", shape, (2 / shape[0]) ** 0.5), ("bias", shape[:1], 0.02)):
                    entries[f"adapter_learner.{ours}.{layer}.{part}.{kind}"] = {
                        "official": f"adapter_learner.{official}.{layer}.{part}.{kind}", "shape": kind_shape,
                        "init_std": std}
        for kind, shape, std in (("weight", (dim, dim), (2 / dim) ** 0.5), ("bias", (dim,), 0.02)):
            entries[f"adapter_learner.shared.{layer}.0.{kind}"] = {
                "official": f"adapter_learner.shared_adapter.{layer}.0.{kind}", "shape": shape, "init_std": std}
    return entries


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.mma import MMACLIP

    return MMACLIP(clip, tokenizer, classnames, node)


SPECS = {
    "MMA": {
        "repository": "ZjjConan/Multi-Modal-Adapter",
        "code_dir": "",
        "official_module": "trainers.mmadapter",
        "official_trainer": "MultiModalAdapter",
        "official_cfg": {"TRAINER.MMADAPTER": dict(NODE)},
        "our_node": dict(NODE),
        "learnables": adapter_learnables(),
        "outputs": ("logits", "loss"),
        "build_ours": build_ours,
        "run_ours": run_ours_logits_and_ce,
        "run_official": run_official_logits_and_ce,
    },
}
