"""Measure what each deep attention head of the tiny synthetic CLIP encodes.

    python tools/synthetic_head_roles.py [--layers 3] [--num-images 2000]

The synthetic world knows the true attributes of every image, so the heads can be
read without a text corpus: for pretraining-style images, each head's direct
contribution to the image feature (vlprompt.interpret.decomposition, Gandelsman et
al.'s decomposition) is split by attribute value, and the share of the contribution's
variance that each attribute explains (eta squared: between-value variance / total
variance) is printed per head, with its entropy over attributes. This is the evidence
behind the hand-made role map configs/head_roles/tiny_synthetic.yaml; the rule that
turns it into roles is in that file's notes.
"""
import argparse

import numpy as np
import torch

from vlprompt.clip import CLIPRunner, load_clip
from vlprompt.interpret.concepts import concept_entropy
from vlprompt.interpret.decomposition import decompose_image_features
from vlprompt.project import repository_root
from vlprompt.synthetic.captions import attribute_ids
from vlprompt.synthetic.pretraining import images_to_tensor
from vlprompt.synthetic.world import ATTRIBUTES, render, sample_scene

CONFIG = str(repository_root() / "configs" / "clip" / "tiny-synthetic-clip.json")
WEIGHTS = str(repository_root() / "weights" / "tiny-synthetic-clip.pt")


def eta_squared(contributions, values):
    """Share of the variance of ``contributions`` [N, E] explained by the grouping ``values`` [N]."""
    centred = contributions - contributions.mean(axis=0)
    total = (centred ** 2).sum()
    between = 0.0
    for value in np.unique(values):
        group = centred[values == value]
        between += len(group) * (group.mean(axis=0) ** 2).sum()
    return between / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--weights", default=WEIGHTS)
    parser.add_argument("--layers", type=int, default=3, help="number of last layers to analyse")
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    model, _ = load_clip(args.config, args.weights)
    runner = CLIPRunner(model)
    rng = np.random.default_rng([args.seed, 7])
    scenes = [sample_scene(rng) for _ in range(args.num_images)]
    images = images_to_tensor([render(scene, rng) for scene in scenes])
    with torch.no_grad():
        heads = decompose_image_features(runner.visual, images, args.layers).heads.numpy()  # [N, n, H, E]
    depth = runner.visual.num_layers
    values = attribute_ids(scenes)  # [N, len(ATTRIBUTES)]

    print(f"eta^2 of each head's direct contribution per attribute ({args.num_images} pretraining-style images)")
    print("layer head  " + " ".join(f"{a:>10}" for a in ATTRIBUTES) + "   entropy  dominant")
    for i in range(heads.shape[1]):
        for h in range(heads.shape[2]):
            shares = np.array([eta_squared(heads[:, i, h], values[:, k]) for k in range(len(ATTRIBUTES))])
            p = shares / shares.sum()
            entropy = concept_entropy(p)
            layer = depth - heads.shape[1] + i + 1
            print(f"{layer:>5} {h:>4}  " + " ".join(f"{v:10.3f}" for v in shares)
                  + f"   {entropy:7.3f}  {ATTRIBUTES[int(np.argmax(shares))]} ({p.max():.0%})")


if __name__ == "__main__":
    main()
