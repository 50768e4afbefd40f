"""RAda's synthetic fft and ttt configs do what their headers say, on the committed tiny CLIP
and images of the SyntheticShapes world: stage 1 (L-infinity mask loss) moves the mask away
from 1 where the paper's L2 loss keeps it there, and the test-time views are flips only."""
import os

import numpy as np
import pytest
import torch

import trainers  # noqa: F401  (every trainer's config node)
from trainers.rada_fft import RAdaFFTCLIP
from datasets.synthetic import SyntheticShapes
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file
from vlprompt.data.test_time_views import ViewAugmenter
from vlprompt.optim import build_optimizer
from vlprompt.synthetic.downstream import SETS
from vlprompt.synthetic.pretraining import images_to_tensor
from vlprompt.synthetic.world import render, sample_scene

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_CLASSES, PER_CLASS, STEPS = 8, 4, 15


def config(path):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, path))
    return cfg


def shapes_batch():
    """(images [32, 3, 32, 32], labels [32], class names) of the first 8 SyntheticShapes classes,
    drawn as the set's renderer draws its training images."""
    spec = SETS["SyntheticShapes"]
    images, labels = [], []
    for label, synth_class in enumerate(spec.classes[:NUM_CLASSES]):
        for n in range(PER_CLASS):
            rng = np.random.default_rng([spec.seed, label, 0, n])
            images.append(render(sample_scene(rng, spec.style, **synth_class.attributes), rng, spec.style))
            labels.append(label)
    return images_to_tensor(images), torch.tensor(labels), [c.name for c in spec.classes[:NUM_CLASSES]]


def mask_shift_after_training(cfg, images, labels, classnames):
    """Mean over images of max |M - 1| after STEPS stage-1 steps (the config's optimiser), and
    the cross-entropy before and after."""
    model, _ = load_clip(cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS)
    node = cfg.TRAINER.RADAFFT
    torch.manual_seed(0)
    fft = RAdaFFTCLIP(CLIPRunner(model), Tokenizer(cfg.MODEL.BACKBONE.NAME), classnames, [SyntheticShapes.template], node)
    fft.set_stage(node.STAGE)
    fft.train()
    optimizer = build_optimizer([p for p in fft.parameters() if p.requires_grad], cfg.OPTIM)
    ces = []
    for _ in range(STEPS):
        logits, mask = fft(images)
        loss, terms = fft.objective(logits, mask, labels)
        ces.append(float(terms["ce"]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        logits, mask = fft(images)
    shift = (mask - 1).abs().flatten(1).max(dim=1).values.mean().item()
    return shift, ces[0], float(torch.nn.functional.cross_entropy(logits, labels))


@pytest.mark.slow  # two 15-step trainings of the committed tiny CLIP
def test_synthetic_fft_stage1_moves_the_mask_with_linf_and_not_with_l2(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = config("configs/trainers/RAdaFFT/synthetic_stage1.yaml")
    assert cfg.TRAINER.RADAFFT.MASK_LOSS == "linf" and cfg.TRAINER.RADAFFT.STAGE == 1
    images, labels, classnames = shapes_batch()
    linf_shift, ce_before, ce_after = mask_shift_after_training(cfg, images, labels, classnames)
    cfg.defrost()
    cfg.TRAINER.RADAFFT.MASK_LOSS = "l2"
    l2_shift, _, _ = mask_shift_after_training(cfg, images, labels, classnames)
    assert linf_shift > 0.1, f"max |M - 1| is only {linf_shift:.4f} with the L-infinity loss"
    assert ce_after < ce_before - 0.1
    assert l2_shift < linf_shift / 3, f"L2 {l2_shift:.4f} vs L-infinity {linf_shift:.4f}"


def test_synthetic_ttt_views_are_the_test_view_and_its_flips():
    cfg = config("configs/trainers/RAdaTTT/synthetic.yaml")
    node = cfg.TRAINER.RADATTT
    spec = SETS["SyntheticShapes"]
    rng = np.random.default_rng([spec.seed, 0, 0, 0])
    image = render(sample_scene(rng, spec.style, **spec.classes[0].attributes), rng, spec.style)
    views = ViewAugmenter(cfg, node.NUM_VIEWS)(image, seed=3)
    assert views.shape == (node.NUM_VIEWS, 3, 32, 32)
    torch.testing.assert_close(views[0], images_to_tensor([image])[0])
    flipped = [torch.equal(view, views[0].flip(-1)) for view in views[1:]]
    assert all(flipped[i] or torch.equal(view, views[0]) for i, view in enumerate(views[1:]))
    assert int(node.NUM_VIEWS * node.SELECTION) == 2
