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

For tools/benchmark.py official, ``official_step_side`` is the body of upstream's training loop
(src/models/flyp_loss.py): ``CLIPEncoder`` (``clip.load`` of the weights file, fp32), AdamW (lr
1e-5, weight decay 0.1, every parameter) with its ``cosine_lr`` schedule; per step the schedule,
``zero_grad``, the encoder's forward of the batch's images and captions (image i captioned with
template i mod 80 of its class, as our case's loader rows; tokenised once, as the loader does),
``ClipLoss``, backward and the AdamW step. Upstream wraps the encoder in ``DataParallel``, which on
one device calls it directly; its ``logit_scale2[0]`` indexes the scale that ``DataParallel``
gathers over GPUs, on one process the scalar itself.
"""
import math
from argparse import Namespace

import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation
from .common import stand_in_datasets

ROW_TEMPLATES = [3, 41]  # the rows' template indices into the 80 ImageNet templates


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.flyp import FLYPCLIP
    from vlprompt.clip import imagenet_templates

    templates = imagenet_templates() if node.TEMPLATE_ENSEMBLE else [node.TEMPLATE]
    return FLYPCLIP(clip, tokenizer, classnames, templates)


def run_ours(model, node, images, labels):
    with torch.no_grad():
        loss, _, _ = model.loss(images, labels, torch.tensor(node.ROW_TEMPLATES))
        logits = model(images)
    return {"loss": loss, "logits": logits}


def official_side(request, weights_path, inputs):
    """In the subprocess (the official tree on PYTHONPATH): {"loss", "logits"} of the official code."""
    stand_in_datasets(request["classnames"])
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


def official_step_side(request, weights_path, inputs):
    """In the benchmark's subprocess: (FLYP's training step, its optimizer); see the module docstring."""
    from open_clip import tokenize

    from clip.loss import ClipLoss
    from src.models.modeling import CLIPEncoder
    from src.models.utils import cosine_lr
    from src.templates import openai_imagenet_template

    images, labels = inputs["images"], inputs["labels"]
    args = Namespace(model=weights_path, device="cpu", cache_dir=None)
    model = CLIPEncoder(args, keep_lang=True)
    model.train()
    captions = [openai_imagenet_template[i % len(openai_imagenet_template)](request["classnames"][y])
                for i, y in enumerate(labels.tolist())]
    texts = tokenize(captions)
    loss_fn = ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=True, rank=0, world_size=1,
                       use_horovod=False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1)
    scheduler = cosine_lr(optimizer, 1e-5, 500, 10 * 1000, 0)

    def step():
        scheduler(0)
        optimizer.zero_grad()
        image_features, text_features, scale = model(images, texts)
        loss_fn(image_features, text_features, scale).backward()
        optimizer.step()

    return step, optimizer


def fixed_temperature(learnables):
    """The logit scale fixed at log(100) (the random weights'), not learned."""
    return dict(learnables, **{"clip.logit_scale": torch.tensor(math.log(100.0))})


SPECS = (
    MethodSpec(
        name="FLYP",
        repository="locuslab/FLYP",
        labels=(0, 0),
        our_node={"TEMPLATE_ENSEMBLE": True, "TEMPLATE": "", "ROW_TEMPLATES": list(ROW_TEMPLATES)},
        # exp(logit_scale) drawn around 1/0.07 (CLIP's init), away from the random weights' 100
        learnables={"clip.logit_scale": Learnable("logit_scale", 0.05, (), init_mean=2.659)},
        outputs=("loss", "logits"),
        build_ours=build_ours,
        run_ours=run_ours,
        official_side=official_side,
        mutations=(
            # the rows' captions exchanged: the loss moves, the head (all templates) does not
            Mutation("row templates swapped", node={"ROW_TEMPLATES": [41, 3]}, node_read_at_run=True,
                     fails=("loss",), unchanged=("logits",)),
            Mutation("one template instead of 80", node={"TEMPLATE_ENSEMBLE": False, "TEMPLATE": "a photo of a {}.",
                                                         "ROW_TEMPLATES": [0, 0]}),
            Mutation("fixed temperature of 100", values=fixed_temperature, fails=("loss", "logits")),
        ),
        cost=CostSpec(step_side=official_step_side, our_nodes={}),  # our case: the recipe (80 templates)
    ),
)
