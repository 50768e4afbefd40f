"""Contrastive pretraining data and loss for the tiny CLIP of the synthetic world.

Batch ``step`` of a run with seed ``seed`` is drawn from ``numpy.random.default_rng([seed,
step])``, so the data stream is the same whatever the number of worker processes.
Each batch holds B pretraining-style images and one caption per image; since captions
usually state only some attributes, a caption is a positive for every image of the
batch it truly describes (:func:`multi_positive_loss`).
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset, get_worker_info

from .captions import attribute_ids, caption, describes
from .world import ATTRIBUTES, PRETRAIN_STYLE, render, sample_scene

__all__ = ["PairBatches", "make_batch", "multi_positive_loss", "images_to_tensor"]

# CLIP's normalisation, as in the trainer configs of the synthetic benchmark.
PIXEL_MEAN = (0.48145466, 0.4578275, 0.40821073)
PIXEL_STD = (0.26862954, 0.26130258, 0.27577711)


def images_to_tensor(images):
    """PIL images -> normalised float tensor [N, 3, H, W]."""
    array = np.stack([np.asarray(image, dtype=np.float32) for image in images]) / 255.0
    mean, std = np.array(PIXEL_MEAN, np.float32), np.array(PIXEL_STD, np.float32)
    return torch.from_numpy((array - mean) / std).permute(0, 3, 1, 2).contiguous()


def make_batch(seed, step, batch_size, tokenizer, style=PRETRAIN_STYLE):
    """Batch ``step`` of the pretraining stream.

    Returns:
        dict with "images" [B, 3, 32, 32] (normalised), "tokens" [B, L] (long),
        "positives" [B, B] bool (caption j is true of image i; the diagonal is True)
        and "captions" (B strings).
    """
    rng = np.random.default_rng([seed, step])
    scenes = [sample_scene(rng, style) for _ in range(batch_size)]
    images = [render(scene, rng, style) for scene in scenes]
    texts, mentioned = zip(*(caption(scene, rng) for scene in scenes))
    ids = attribute_ids(scenes)
    mentioned_mask = np.array([[a in m for a in ATTRIBUTES] for m in mentioned])
    return {
        "images": images_to_tensor(images),
        "tokens": torch.as_tensor(tokenizer(list(texts)), dtype=torch.long),
        "positives": torch.from_numpy(describes(ids, ids, mentioned_mask)),
        "captions": list(texts),
    }


class PairBatches(IterableDataset):
    """Batches ``start .. stop-1`` of the stream (use with ``batch_size=None``).

    With several DataLoader workers, worker w makes the steps congruent to w, and the
    loader's round-robin order returns them in step order.
    """

    def __init__(self, seed, start, stop, batch_size, tokenizer):
        self.seed, self.start, self.stop = seed, start, stop
        self.batch_size, self.tokenizer = batch_size, tokenizer

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            torch.set_num_threads(1)
        for step in range(self.start + worker, self.stop, workers):
            yield make_batch(self.seed, step, self.batch_size, self.tokenizer)


def multi_positive_loss(image_features, text_features, positives, logit_scale):
    """Symmetric contrastive loss with several positives per row.

    Each image's target is uniform over the captions true of it, and each caption's
    target uniform over the images it describes.

    Args:
        image_features: [B, E] L2-normalised.
        text_features: [M, E] L2-normalised.
        positives: [B, M] bool, at least one True in every row and column.
        logit_scale: scalar temperature (already exponentiated).

    Returns:
        scalar loss.
    """
    logits = logit_scale * image_features @ text_features.t()
    targets = positives.float()
    image_loss = -(targets / targets.sum(1, keepdim=True) * F.log_softmax(logits, dim=1)).sum(1).mean()
    text_loss = -(targets / targets.sum(0, keepdim=True) * F.log_softmax(logits, dim=0)).sum(0).mean()
    return (image_loss + text_loss) / 2


# Zero-shot prompts of the attribute probe: attribute -> (template, vocabulary words).
PROBE_PROMPTS = {
    "shape": ("a photo of a {}", None),
    "color": ("a photo of a {} shape", None),
    "texture": ("a photo of a {} shape", None),
    "location": ("a photo of a shape in the {}", None),
    "size": ("a photo of a {} shape", ("small", "medium", "large")),
    "background": ("a photo of a shape on a {} background", ("plain", "noisy", "gradient", "cluttered")),
}


@torch.no_grad()
def attribute_probe(model, tokenizer, seed, count=512, style=PRETRAIN_STYLE):
    """Zero-shot accuracy of an open_clip model on each attribute of held-out scenes.

    Args:
        model: open_clip CLIP (eval mode is set by the caller).
        tokenizer: open_clip tokenizer.
        seed: seed of the held-out scenes.
        count: number of scenes.

    Returns:
        dict attribute -> accuracy in [0, 1].
    """
    from .world import BACKGROUNDS, COLORS, LOCATIONS, SHAPES, SIZES, TEXTURES

    rng = np.random.default_rng([seed, 10 ** 9])
    scenes = [sample_scene(rng, style) for _ in range(count)]
    images = images_to_tensor([render(scene, rng, style) for scene in scenes])
    image_features = F.normalize(model.encode_image(images), dim=-1)
    vocabularies = {"shape": SHAPES, "color": tuple(COLORS), "texture": TEXTURES,
                    "location": tuple(LOCATIONS), "size": tuple(SIZES), "background": BACKGROUNDS}
    accuracies = {}
    for attribute, (template, words) in PROBE_PROMPTS.items():
        values = [v for v in vocabularies[attribute] if v in {getattr(s, attribute) for s in scenes}]
        words = words or values
        tokens = torch.as_tensor(tokenizer([template.format(w) for w in words]), dtype=torch.long)
        text_features = F.normalize(model.encode_text(tokens), dim=-1)
        predicted = (image_features @ text_features.t()).argmax(dim=1).numpy()
        truth = np.array([values.index(getattr(s, attribute)) for s in scenes])
        accuracies[attribute] = float((predicted == truth).mean())
    return accuracies
