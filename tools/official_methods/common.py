"""Steps several methods share, on either side of the comparison."""
import torch
import torch.nn.functional as F


def logits_and_ce(model, images, labels):
    """``model(images)`` in eval: {"logits": [B, C], "loss": the batch's cross-entropy}."""
    with torch.no_grad():
        logits = model(images)
    return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


def run_ours_logits_and_ce(model, node, images, labels):
    return logits_and_ce(model, images, labels)


def run_official_logits_and_ce(module, cfg, request, model, images, labels):
    return logits_and_ce(model, images, labels)
