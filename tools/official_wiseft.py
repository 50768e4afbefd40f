"""FT's model and WiSE-FT's interpolation side by side with mlfoundations/wise-ft on the same random weights.

wise-ft is not a Dassl repository, so tools/official_equivalence.py's Dassl harness does not run it;
this tool reuses that harness's pieces (seeded random CLIP files, ``git archive`` export, stand-ins,
relative max difference, fixture rounding) and runs the official functions themselves in a
subprocess with the exported tree on ``PYTHONPATH``:

* zero-shot model: ``src.models.modeling.ImageEncoder`` (its vendored ``clip.load`` of the random
  CLIP file, fp32 on the CPU), ``src.models.zeroshot.get_zeroshot_classifier`` (80 OpenAI ImageNet
  templates of ``src.templates.openai_imagenet_template``; the class names come from a stand-in
  dataset class in ``src.datasets``, where the function looks the training set up: that package's
  ``__init__``, which imports every dataset and wilds, is not run, its modules load as they are) and
  ``ImageClassifier``; outputs: the head's weight and bias, the logits of a seeded batch and its
  cross-entropy (``torch.nn.CrossEntropyLoss``, as ``finetune``);
* a "fine-tuned" model: ``ImageEncoder`` of a second random CLIP file and a ``ClassificationHead``
  whose weight and bias are the zero-shot head's plus seeded noise (N(0, 1)); ``src.wise_ft._merge``
  at α = 0.5 of the two ``ImageClassifier`` state dicts, loaded into the fine-tuned model; output:
  its logits of the batch.

Ours: trainers/ft.py's FineTunedCLIP on the same two files (head templates: CLIP's 80), the same
noise added to the fine-tuned head, trainers/wiseft.py's ``interpolate`` over the trained
parameters. Writes tests/fixtures/official/wiseft.json (seeds, class names, labels, official
outputs, relative max differences, commit), which tests/test_official_equivalence_wiseft.py
rebuilds our side against.

Usage:

    python tools/official_wiseft.py --official-git /path/to/wise-ft   # a clone or its git directory
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import types

import torch

from vlprompt.fileio import atomic_write

import official_equivalence as oe  # tools/official_equivalence.py, next to this file

SEEDS = {"weights": 1, "finetuned_weights": 4, "images": 3, "head_noise": 5}
ALPHA = 0.5
BACKBONE = "ViT-B/16"
OUTPUTS = ("head_weight", "head_bias", "logits", "loss", "wise_logits")
FIXTURE = os.path.join(oe.FIXTURE_DIR, "wiseft.json")


def make_inputs(resolution, width, n_classes, batch, seeds):
    """Seeded images [B, 3, R, R], labels [B] and head noise {"weight": [C, E], "bias": [C]}."""
    generator = torch.Generator().manual_seed(seeds["images"])
    images = torch.randn((batch, 3, resolution, resolution), generator=generator)
    labels = torch.arange(batch) % n_classes
    generator = torch.Generator().manual_seed(seeds["head_noise"])
    noise = {"weight": torch.randn((n_classes, width), generator=generator),
             "bias": torch.randn((n_classes,), generator=generator)}
    return images, labels, noise


def our_outputs(zs_path, ft_path, classnames, images, labels, noise, alpha=ALPHA):
    """Our outputs {name: tensor} (see the module docstring)."""
    import torch.nn.functional as F

    from vlprompt.clip import IMAGENET_TEMPLATES, CLIPRunner, Tokenizer, load_clip
    from vlprompt_app.project import import_project_package

    trainers = import_project_package("trainers")
    ft, wiseft = trainers.ft, trainers.wiseft

    def build(path, templates):
        clip, _ = load_clip(BACKBONE, path)
        model = ft.FineTunedCLIP(CLIPRunner(clip), Tokenizer(BACKBONE), classnames, templates).eval()
        model.set_trainable(True)
        return model

    zero_shot = build(zs_path, IMAGENET_TEMPLATES)
    with torch.no_grad():
        logits = zero_shot(images)
        outputs = {"head_weight": zero_shot.head.weight.clone(), "head_bias": zero_shot.head.bias.clone(),
                   "logits": logits, "loss": F.cross_entropy(logits, labels)}
        fine_tuned = build(ft_path, IMAGENET_TEMPLATES[:1])  # its head is replaced below
        fine_tuned.head.weight.copy_(zero_shot.head.weight + noise["weight"])
        fine_tuned.head.bias.copy_(zero_shot.head.bias + noise["bias"])
        trained = lambda model: {name: p for name, p in model.named_parameters() if p.requires_grad}  # noqa: E731
        mixed = wiseft.interpolate(trained(zero_shot), trained(fine_tuned), alpha)
        for name, param in trained(fine_tuned).items():
            param.copy_(mixed[name])
        outputs["wise_logits"] = fine_tuned(images)
    return outputs


def _official_side(workdir):
    """In the subprocess (the wise-ft tree on PYTHONPATH): the official outputs into official.pt."""
    oe._install_stand_ins()
    with open(os.path.join(workdir, "request.json")) as f:
        request = json.load(f)
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    class EquivalenceClasses:  # get_zeroshot_classifier reads only .classnames of the training set
        def __init__(self, preprocess, location, batch_size, classnames):
            self.classnames = request["classnames"]

    # src/datasets/__init__.py imports every dataset (wilds, ...); a package of the same folder without it
    datasets = types.ModuleType("src.datasets")
    datasets.__path__ = [os.path.join(workdir, "official", "src", "datasets")]
    datasets.EquivalenceClasses = EquivalenceClasses
    sys.modules["src.datasets"] = datasets
    from src.models.modeling import ClassificationHead, ImageClassifier, ImageEncoder
    from src.models.zeroshot import get_zeroshot_classifier
    from src.wise_ft import _merge

    def args(weights):
        return types.SimpleNamespace(model=os.path.join(workdir, weights), device="cpu", cache_dir=None,
                                     template="openai_imagenet_template", train_dataset="EquivalenceClasses",
                                     data_location=workdir, batch_size=len(inputs["labels"]), classnames="openai")

    zs_args = args("weights.pt")
    encoder = ImageEncoder(zs_args, keep_lang=True)
    head = get_zeroshot_classifier(zs_args, encoder.model)
    delattr(encoder.model, "transformer")
    zero_shot = ImageClassifier(encoder, head, process_images=True).eval()
    images, labels = inputs["images"], inputs["labels"]
    with torch.no_grad():
        logits = zero_shot(images)
        outputs = {"head_weight": head.weight.clone(), "head_bias": head.bias.clone(), "logits": logits,
                   "loss": torch.nn.CrossEntropyLoss()(logits, labels)}
        ft_head = ClassificationHead(normalize=True, weights=head.weight + inputs["noise_weight"],
                                     biases=head.bias + inputs["noise_bias"])
        fine_tuned = ImageClassifier(ImageEncoder(args("finetuned_weights.pt")), ft_head, process_images=True).eval()
        theta_0, theta_1 = zero_shot.state_dict(), fine_tuned.state_dict()
        assert set(theta_0) == set(theta_1)
        fine_tuned.load_state_dict(_merge(request["alpha"], theta_0, theta_1, None, None))
        outputs["wise_logits"] = fine_tuned(images)
    with atomic_write(os.path.join(workdir, "official.pt")) as f:
        torch.save(outputs, f)


def compare(official_git, classnames, batch):
    with tempfile.TemporaryDirectory(prefix="official_wiseft_") as workdir:
        commit = oe._export(official_git, os.path.join(workdir, "official"))
        zs_path, ft_path = os.path.join(workdir, "weights.pt"), os.path.join(workdir, "finetuned_weights.pt")
        resolution, _ = oe.write_weights(BACKBONE, SEEDS["weights"], zs_path)
        oe.write_weights(BACKBONE, SEEDS["finetuned_weights"], ft_path)
        embed = torch.load(zs_path, weights_only=True)["text_projection"].shape[1]
        images, labels, noise = make_inputs(resolution, embed, len(classnames), batch, SEEDS)
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save({"images": images, "labels": labels, "noise_weight": noise["weight"],
                        "noise_bias": noise["bias"]}, f)
        with atomic_write(os.path.join(workdir, "request.json"), "w") as f:
            json.dump({"classnames": classnames, "alpha": ALPHA}, f)
        env = dict(os.environ, PYTHONPATH=os.path.join(workdir, "official"))
        command = [sys.executable, os.path.abspath(__file__), "--official-side", workdir]
        if subprocess.run(command, env=env, cwd=workdir).returncode != 0:
            raise SystemExit(f"The official side failed (its traceback is above): {' '.join(command)}")
        official = torch.load(os.path.join(workdir, "official.pt"), weights_only=True)
        ours = our_outputs(zs_path, ft_path, classnames, images, labels, noise)
    return {
        "method": "WiSEFT",
        "official_repository": "mlfoundations/wise-ft",
        "official_commit": commit,
        "backbone": BACKBONE,
        "seeds": SEEDS,
        "batch": batch,
        "alpha": ALPHA,
        "classnames": classnames,
        "labels": labels.tolist(),
        "official_outputs": {key: oe._rounded(official[key]) for key in OUTPUTS},
        "relative_max_difference": {key: oe.relative_max_difference(ours[key], official[key]) for key in OUTPUTS},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--official-git", help="clone (or git directory) of mlfoundations/wise-ft")
    parser.add_argument("--official-side", metavar="WORKDIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.official_side:
        _official_side(args.official_side)
        return
    if not args.official_git:
        parser.error("--official-git is required")
    fixture = compare(args.official_git, list(oe.DEFAULT_CLASSNAMES), oe.DEFAULT_BATCH)
    with atomic_write(FIXTURE, "w") as f:
        json.dump(fixture, f)
        f.write("\n")
    print(f"WiSEFT/FT vs {fixture['official_repository']}@{fixture['official_commit'][:8]}: relative max difference "
          + ", ".join(f"{key} {value:.2e}" for key, value in fixture["relative_max_difference"].items())
          + f"; wrote {FIXTURE}")


if __name__ == "__main__":
    main()
