"""FT's model and WiSE-FT's interpolation against mlfoundations/wise-ft, and the training step of FT,
LP and WiSE-FT as wise-ft runs it (for tools/benchmark.py official).

Compared ("WiSEFT", fixture wiseft.json; no Dassl, ``official_side`` runs the official functions):

* zero-shot model: ``src.models.modeling.ImageEncoder`` (its vendored ``clip.load`` of the random
  CLIP file, fp32 on the CPU), ``src.models.zeroshot.get_zeroshot_classifier`` (80 OpenAI ImageNet
  templates of ``src.templates.openai_imagenet_template``; the class names come from a stand-in
  dataset class in ``src.datasets``, where the function looks the training set up: that package's
  ``__init__``, which imports every dataset and wilds, is not run, its modules load as they are) and
  ``ImageClassifier``; outputs: the head's weight [C, E] and bias [C], the logits [B, C] of a seeded
  batch and its cross-entropy (``torch.nn.CrossEntropyLoss``, as ``finetune``);
* a "fine-tuned" model: ``ImageEncoder`` of a second random CLIP (seed ``finetuned_weights``) and a
  ``ClassificationHead`` whose weight and bias are the zero-shot head's plus seeded noise (N(0, 1),
  seed ``head_noise``); ``src.wise_ft._merge`` at α = 0.5 of the two ``ImageClassifier`` state
  dicts, loaded into the fine-tuned model; output: its logits [B, C] ("wise_logits").

Ours: trainers/ft.py's FineTunedCLIP on the same two CLIPs (head templates: CLIP's 80), the same
noise added to the fine-tuned head, trainers/wiseft.py's ``interpolate`` over the trained
parameters. α = 0.3 instead of 0.5 must fail.

Timed (``FT``, ``LP``, ``WiSEFT``): the model is the zero-shot classifier that src/wise_ft.py saves
and src/models/finetune.py loads: ``ImageEncoder``, ``get_zeroshot_classifier``'s
``ClassificationHead`` (template set ``simple_template``, one sentence, as our cases'
TEMPLATE_ENSEMBLE False: the head's templates do not change the step's cost) and
``ImageClassifier``. The step is the body of finetune.py's loop: its ``cosine_lr`` schedule,
``zero_grad``, the forward, ``CrossEntropyLoss``, backward, ``clip_grad_norm_`` (1.0) over the
optimizer's parameters, the AdamW step (weight decay 0.1). Upstream wraps the model in
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
is stood in by a module whose one dataset class holds the class names.
"""
import os
import sys
import types
from argparse import Namespace

import torch
from torch import nn

from ..spec import DEFAULT_BACKBONE, CostSpec, MethodSpec, Mutation
from ..weights import seeded_clip, write_weights
from .common import stand_in_datasets

TEMPLATE = "simple_template"
ALPHA = 0.5  # the interpolation the fixture compares
SEEDS = {"weights": 1, "finetuned_weights": 4, "images": 3, "head_noise": 5}
OUTPUTS = ("head_weight", "head_bias", "logits", "loss", "wise_logits")


def head_noise(n_classes, width, seed):
    """The seeded noise added to the fine-tuned head: {"weight": [C, E], "bias": [C]}, N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn((n_classes, width), generator=generator),
            "bias": torch.randn((n_classes,), generator=generator)}


def build_ours(clip, tokenizer, classnames, node, spec):
    """{"zero_shot", "fine_tuned"}: FineTunedCLIP on ``clip`` (80-template head) and on the second seeded
    CLIP, whose head is the zero-shot head plus the seeded noise."""
    from vlprompt.clip import CLIPRunner, imagenet_templates
    from vlprompt.methods.zero_shot_head import FineTunedCLIP

    def build(runner, templates):
        model = FineTunedCLIP(runner, tokenizer, classnames, templates).eval()
        model.set_trainable(True)
        return model

    zero_shot = build(clip, imagenet_templates())
    fine_tuned = build(CLIPRunner(seeded_clip(DEFAULT_BACKBONE, spec.seeds["finetuned_weights"])), imagenet_templates()[:1])
    noise = head_noise(len(classnames), zero_shot.head.weight.shape[1], spec.seeds["head_noise"])
    with torch.no_grad():  # its head is replaced
        fine_tuned.head.weight.copy_(zero_shot.head.weight + noise["weight"])
        fine_tuned.head.bias.copy_(zero_shot.head.bias + noise["bias"])
    return nn.ModuleDict({"zero_shot": zero_shot, "fine_tuned": fine_tuned})


def _trained(model):
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def run_ours(model, node, images, labels):
    """The zero-shot head, logits [B, C] and CE; the logits [B, C] of the fine-tuned end interpolated at
    ``node.ALPHA`` (its own values restored afterwards, so that the model serves another α)."""
    import torch.nn.functional as F

    from trainers.wiseft import interpolate

    zero_shot, fine_tuned = model["zero_shot"], model["fine_tuned"]
    with torch.no_grad():
        logits = zero_shot(images)
        outputs = {"head_weight": zero_shot.head.weight.clone(), "head_bias": zero_shot.head.bias.clone(),
                   "logits": logits, "loss": F.cross_entropy(logits, labels)}
        own = {name: param.clone() for name, param in _trained(fine_tuned).items()}
        mixed = interpolate(_trained(zero_shot), _trained(fine_tuned), node.ALPHA)
        for name, param in _trained(fine_tuned).items():
            param.copy_(mixed[name])
        outputs["wise_logits"] = fine_tuned(images)
        for name, param in _trained(fine_tuned).items():
            param.copy_(own[name])
    return outputs


def official_side(request, weights_path, inputs):
    """In the subprocess (the wise-ft tree on PYTHONPATH): the official outputs {name: tensor}."""
    classnames, seeds = request["classnames"], request["seeds"]

    class EquivalenceClasses:  # get_zeroshot_classifier reads only .classnames of the training set
        def __init__(self, preprocess, location, batch_size, classnames):
            self.classnames = request["classnames"]

    # src/datasets/__init__.py imports every dataset (wilds, ...); a package of the same folder without it
    datasets = types.ModuleType("src.datasets")
    datasets.__path__ = [next(os.path.join(entry, "src", "datasets") for entry in sys.path
                              if os.path.isdir(os.path.join(entry, "src", "datasets")))]
    datasets.EquivalenceClasses = EquivalenceClasses
    sys.modules["src.datasets"] = datasets
    from src.models.modeling import ClassificationHead, ImageClassifier, ImageEncoder
    from src.models.zeroshot import get_zeroshot_classifier
    from src.wise_ft import _merge

    workdir = os.path.dirname(weights_path)
    finetuned_path = os.path.join(workdir, "finetuned_weights.pt")
    write_weights(request["backbone"], seeds["finetuned_weights"], finetuned_path)
    images, labels = inputs["images"], inputs["labels"]

    def args(path):
        return types.SimpleNamespace(model=path, device="cpu", cache_dir=None, template="openai_imagenet_template",
                                     train_dataset="EquivalenceClasses", data_location=workdir,
                                     batch_size=len(labels), classnames="openai")

    zs_args = args(weights_path)
    encoder = ImageEncoder(zs_args, keep_lang=True)
    head = get_zeroshot_classifier(zs_args, encoder.model)
    delattr(encoder.model, "transformer")
    zero_shot = ImageClassifier(encoder, head, process_images=True).eval()
    noise = head_noise(len(classnames), head.weight.shape[1], seeds["head_noise"])
    with torch.no_grad():
        logits = zero_shot(images)
        outputs = {"head_weight": head.weight.clone(), "head_bias": head.bias.clone(), "logits": logits,
                   "loss": torch.nn.CrossEntropyLoss()(logits, labels)}
        ft_head = ClassificationHead(normalize=True, weights=head.weight + noise["weight"],
                                     biases=head.bias + noise["bias"])
        fine_tuned = ImageClassifier(ImageEncoder(args(finetuned_path)), ft_head, process_images=True).eval()
        theta_0, theta_1 = zero_shot.state_dict(), fine_tuned.state_dict()
        assert set(theta_0) == set(theta_1)
        fine_tuned.load_state_dict(_merge(ALPHA, theta_0, theta_1, None, None))
        outputs["wise_logits"] = fine_tuned(images)
    return outputs


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


REPOSITORY = "mlfoundations/wise-ft"
COMPARED_BY = "WiSEFT (its fixture compares FT's model and head)"
SPECS = (
    MethodSpec(
        name="WiSEFT",
        repository=REPOSITORY,
        dassl=False,
        seeds=dict(SEEDS),
        our_node={"ALPHA": ALPHA},
        outputs=OUTPUTS,
        build_ours=build_ours,
        run_ours=run_ours,
        official_side=official_side,
        mutations=(Mutation("alpha 0.3 instead of 0.5", node={"ALPHA": 0.3}, node_read_at_run=True,
                            fails=("wise_logits",)),),
        cost=CostSpec(step_side=official_step_side, our_nodes={}),
    ),
    MethodSpec(name="FT", repository=REPOSITORY, dassl=False, compared_by=COMPARED_BY,
               cost=CostSpec(step_side=official_step_side, our_nodes={})),
    MethodSpec(name="LP", repository=REPOSITORY, dassl=False, compared_by=COMPARED_BY,
               cost=CostSpec(step_side=official_linear_probe_step, our_nodes={})),
)
