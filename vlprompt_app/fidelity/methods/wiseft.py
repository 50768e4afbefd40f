"""FT, LP and WiSE-FT's training step as mlfoundations/wise-ft runs it, for tools/benchmark.py official.

Their side-by-side comparison of outputs is tools/official_wiseft.py (its own fixture,
tests/fixtures/official/wiseft.json); these specs only time the official step. The model is the
zero-shot classifier that src/wise_ft.py saves and src/models/finetune.py loads: ``ImageEncoder``
(its vendored ``clip.load`` of the weights file, fp32, the text tower deleted after the head is
built), ``get_zeroshot_classifier``'s ``ClassificationHead`` (template set ``simple_template``,
one sentence, as our cases' TEMPLATE_ENSEMBLE False: the head's templates do not change the
step's cost) and ``ImageClassifier``. The step is the body of finetune.py's loop: its ``cosine_lr``
schedule, ``zero_grad``, the forward, ``CrossEntropyLoss``, backward, ``clip_grad_norm_`` (1.0)
over the optimizer's parameters, the AdamW step (weight decay 0.1). Upstream wraps the model in
``DataParallel``, which on one device calls it directly.

* ``FT`` and ``WiSEFT`` (whose training is FT's; the interpolation is evaluation only): end to
  end, the classifier with ``process_images`` on the batch's images. Upstream's AdamW also holds
  the CLIP text parts left in the encoder (token and positional embeddings, ln_final, the text
  projection, the logit scale), which never get a gradient, so it never updates them.
* ``LP`` (``--freeze-encoder``): the head alone, on the image features that upstream's
  ``get_dataloader(..., image_encoder=...)`` computes once with the frozen encoder (``get_features``,
  cached to disk); they are computed once here too, before the rounds, as our LP case's feature
  cache gives them.

The source has no ``__init__.py`` under ``src``; ``src.datasets`` (which imports every dataset)
is stood in by a module whose one dataset class holds the benchmark's class names.
"""
from argparse import Namespace

import torch

from .common import stand_in_datasets

TEMPLATE = "simple_template"


def official_step_side(request, weights_path, inputs, freeze_encoder=False, lr=3e-5):
    """In the benchmark's subprocess: (finetune.py's training step, its optimizer)."""
    stand_in_datasets(request["classnames"])
    from src.models.modeling import ImageClassifier, ImageEncoder
    from src.models.utils import cosine_lr
    from src.models.zeroshot import get_zeroshot_classifier

    images, labels = inputs["images"], inputs["labels"]
    args = Namespace(model=weights_path, device="cpu", cache_dir=None, template=TEMPLATE,
                     train_dataset="FixtureClasses", data_location=None, batch_size=len(labels), classnames="openai")
    encoder = ImageEncoder(args, keep_lang=True)
    head = get_zeroshot_classifier(args, encoder.model)
    delattr(encoder.model, "transformer")
    classifier = ImageClassifier(encoder, head, process_images=False)  # as src/wise_ft.py saves it
    if freeze_encoder:
        model = classifier.classification_head
        with torch.no_grad():
            batch_inputs = encoder(images)  # get_features: the frozen encoder's features
    else:
        model, batch_inputs = classifier, images
        classifier.process_images = True
    model.train()
    loss_fn = torch.nn.CrossEntropyLoss()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    scheduler = cosine_lr(optimizer, lr, 500, 10 * 1000)

    def step():
        scheduler(0)
        optimizer.zero_grad()
        loss_fn(model(batch_inputs), labels).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step, optimizer


def official_linear_probe_step(request, weights_path, inputs):
    return official_step_side(request, weights_path, inputs, freeze_encoder=True, lr=4e-3)


_COMMON = {
    "repository": "mlfoundations/wise-ft",
    "code_dir": "",
    "dassl": False,
    "compared_by": "tools/official_wiseft.py",
    "official_step_side": official_step_side,
}

SPECS = {
    "FT": dict(_COMMON, our_nodes={}),
    "LP": dict(_COMMON, our_nodes={}, official_step_side=official_linear_probe_step),
    "WiSEFT": dict(_COMMON, our_nodes={}),
}
