"""FLYP against locuslab/FLYP (no Dassl: the official side is built here, ``official_side``).

Compared, on the seeded random CLIP whose every weight FLYP fine-tunes (the logit scale, learned
by FLYP, is drawn away from log(100) so that a fixed temperature shows):

* "loss": one training step's contrastive loss on 2 (image, caption) rows, the images labelled
  [0, 0] with the templates ROW_TEMPLATES (two captions of the same class, negatives of each
  other as upstream). Upstream: ``clip.load`` of the weights file (clip/clip.py, fp32), the
  captions written by datacreation_scripts/imagenet_csv_creator.py's rule (template t of
  src/templates' openai_imagenet_template on the class name) and tokenised as its CsvDataset does
  (open_clip's ``tokenize``), ``CLIP.forward`` and ``clip.loss.ClipLoss`` as flyp_loss.py builds it.
* "logits": the evaluation logits [B, C] after the head is rebuilt: upstream's
  ``src.models.zeroshot.get_zeroshot_classifier`` (80 templates) and its ``ClassificationHead``
  on ``CLIPEncoder``'s image features, as src/models/eval.py computes them.

``get_zeroshot_classifier`` reads the class names from a dataset class of src.datasets; that
package (and the evaluation helpers it imports, which need the data sets) is stood in by a module
whose one dataset class holds the fixture's class names.
"""
import sys
import types
from argparse import Namespace

import torch

ROW_TEMPLATES = [3, 41]  # the rows' template indices into the 80 ImageNet templates


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.flyp import FLYPCLIP
    from vlprompt.clip import IMAGENET_TEMPLATES

    templates = IMAGENET_TEMPLATES if node.TEMPLATE_ENSEMBLE else [node.TEMPLATE]
    return FLYPCLIP(clip, tokenizer, classnames, templates)


def run_ours(model, node, images, labels):
    with torch.no_grad():
        loss, _, _ = model.loss(images, labels, torch.tensor(node.ROW_TEMPLATES))
        logits = model(images)
    return {"loss": loss, "logits": logits}


def _stand_in_datasets(classnames):
    """src.datasets (and src.datasets.common) holding one dataset class, ``FixtureClasses``."""

    class FixtureClasses:
        def __init__(self, preprocess, location=None, batch_size=None, **kwargs):
            self.classnames = list(classnames)

    datasets = types.ModuleType("src.datasets")
    datasets.FixtureClasses = FixtureClasses
    common = types.ModuleType("src.datasets.common")
    common.get_dataloader = common.maybe_dictionarize = None
    sys.modules["src.datasets"], sys.modules["src.datasets.common"] = datasets, common


def official_side(request, weights_path, inputs):
    """In the subprocess (the official tree on PYTHONPATH): {"loss", "logits"} of the official code."""
    _stand_in_datasets(request["classnames"])
    from open_clip import tokenize  # what upstream's CsvDataset tokenises captions with

    from clip import clip as official_clip
    from clip.loss import ClipLoss
    from src.models.zeroshot import get_zeroshot_classifier
    from src.templates import openai_imagenet_template

    model, _, _ = official_clip.load(weights_path, device="cpu", jit=False)
    with torch.no_grad():
        model.logit_scale.copy_(inputs["learnables"]["clip.logit_scale"])
    images, labels = inputs["images"], inputs["labels"]
    captions = [openai_imagenet_template[t](request["classnames"][y]) for t, y in zip(ROW_TEMPLATES, labels.tolist())]
    loss_fn = ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=True, rank=0, world_size=1,
                       use_horovod=False)
    args = Namespace(template="openai_imagenet_template", train_dataset="FixtureClasses", data_location=None,
                     batch_size=len(labels), device="cpu")
    with torch.no_grad():
        image_features, text_features, scale = model(images, tokenize(captions))
        loss = loss_fn(image_features, text_features, scale)
        head = get_zeroshot_classifier(args, model)
        logits = head(model(images, None))
    return {"loss": loss, "logits": logits}


SPECS = {
    "FLYP": {
        "repository": "locuslab/FLYP",
        "code_dir": "",
        "labels": [0, 0],
        "official_cfg": {},
        "our_node": {"TEMPLATE_ENSEMBLE": True, "TEMPLATE": "", "ROW_TEMPLATES": list(ROW_TEMPLATES)},
        # exp(logit_scale) drawn around 1/0.07 (CLIP's init), away from the random weights' 100
        "learnables": {"clip.logit_scale": {"official": "logit_scale", "shape": (), "init_mean": 2.659,
                                            "init_std": 0.05}},
        "outputs": ("loss", "logits"),
        "build_ours": build_ours,
        "run_ours": run_ours,
        "official_side": official_side,
    },
}
