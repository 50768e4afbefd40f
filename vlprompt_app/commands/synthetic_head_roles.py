"""Measure what each deep attention head of the tiny synthetic CLIP encodes, and derive its role map.

    python tools/synthetic_head_roles.py [--layers 3] [--num-images 2000] [--output FILE.yaml]

The synthetic world knows the true attributes of every image, so the heads can be
read without a text corpus: for pretraining-style images, each head's direct
contribution to the image feature (vlprompt.interpret.decomposition, Gandelsman et
al.'s decomposition) is split by attribute value, and the share of the contribution's
variance that each attribute explains (eta squared: between-value variance / total
variance) is printed per head, with its entropy over attributes.

With ``--output`` the table becomes a role-map file by this rule
(``assign_roles``): a head whose dominant attribute explains at least ``--dominance``
(default 40 %) of its summed eta squared is specialised: ``A <attribute>`` for one of
``--attributes`` (DeAR's five), else ``O <attribute>`` (size, background); of the other
heads, the ``floor(--generalization-share x heads)`` with the highest entropy (default
20 %: 2 of 12) are generalization heads ``G``, the rest mixed ``M``. The file's header holds
the table, the rule and the command; configs/head_roles/tiny_synthetic.yaml is this output::

    python tools/synthetic_head_roles.py --output configs/head_roles/tiny_synthetic.yaml
"""
import argparse
import math
import os
import shlex
import sys

import numpy as np
import torch

from vlprompt.clip import CLIPRunner, load_clip
from vlprompt.clip.head_roles import HeadRole, RoleMap, model_file_label
from vlprompt.fileio import write_text
from vlprompt.interpret.concepts import concept_entropy
from vlprompt.interpret.decomposition import decompose_image_features
from vlprompt.interpret.discovery import DEAR_ATTRIBUTES
from vlprompt.paths import repository_root
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


def head_statistics(config, weights, num_layers, num_images, seed):
    """eta squared of every analysed head: (depth of the tower, heads per layer, rows).

    Rows, in layer-then-head order: (1-indexed layer, 0-indexed head, shares [A]) with
    ``shares[k]`` the eta squared of attribute ``ATTRIBUTES[k]``.
    """
    model, _ = load_clip(config, weights)
    runner = CLIPRunner(model)
    rng = np.random.default_rng([seed, 7])
    scenes = [sample_scene(rng) for _ in range(num_images)]
    images = images_to_tensor([render(scene, rng) for scene in scenes])
    with torch.no_grad():
        heads = decompose_image_features(runner.visual, images, num_layers).heads.numpy()  # [N, n, H, E]
    depth = runner.visual.num_layers
    values = attribute_ids(scenes)  # [N, len(ATTRIBUTES)]
    rows = []
    for i in range(heads.shape[1]):
        for h in range(heads.shape[2]):
            shares = np.array([eta_squared(heads[:, i, h], values[:, k]) for k in range(len(ATTRIBUTES))])
            rows.append((depth - heads.shape[1] + i + 1, h, shares))
    return depth, heads.shape[2], rows


def dominant(shares):
    """(dominant attribute, its share of the summed eta squared, entropy of the normalised shares)."""
    p = shares / shares.sum()
    return ATTRIBUTES[int(np.argmax(shares))], float(p.max()), concept_entropy(p)


def assign_roles(rows, attributes, dominance=0.4, generalization_share=0.2):
    """Roles by the module docstring's rule: {(layer, head): HeadRole}.

    Args:
        rows: (layer, head, shares [len(ATTRIBUTES)]) per head (head_statistics).
        attributes: DeAR attributes; a specialised head of another attribute is "O".
        dominance: least share of the dominant attribute for a specialised head.
        generalization_share: share of all heads made "G" (rounded down), taken from the
            non-specialised heads with the highest entropy (ties: earlier layer and head).
    """
    roles, others = {}, []
    for layer, head, shares in rows:
        name, share, entropy = dominant(shares)
        if share >= dominance:
            roles[layer, head] = HeadRole("A" if name in attributes else "O", name)
        else:
            others.append((-entropy, layer, head))
    num_generalization = math.floor(generalization_share * len(rows) + 1e-9)
    for rank, (_, layer, head) in enumerate(sorted(others)):
        roles[layer, head] = HeadRole("G") if rank < num_generalization else HeadRole("M")
    return roles


def specialists(rows, own=0.5, other=0.1):
    """{attribute: [(layer, head)]} of the strict specialists: heads whose eta squared of that
    attribute is at least ``own`` while every other attribute's is at most ``other``."""
    found = {name: [] for name in ATTRIBUTES}
    for layer, head, shares in rows:
        k = int(np.argmax(shares))
        if shares[k] >= own and np.delete(shares, k).max() <= other:
            found[ATTRIBUTES[k]].append((layer, head))
    return found


def summary_lines(rows, dominance):
    """Strict specialists per attribute and the heads without a dominant attribute (the table's measure)."""
    found = specialists(rows)
    lines = ["strict specialists (eta^2 >= 0.50, every other <= 0.10):"]
    for name, heads in found.items():
        where = ", ".join(f"L{layer}H{head}" for layer, head in heads) or "none"
        lines.append(f"  {name:<10} {len(heads):>2}  {where}")
    undominated = sum(dominant(shares)[1] < dominance for _, _, shares in rows)
    lines.append(f"heads without a dominant attribute (dominant < {dominance:.0%} of the row's sum): "
                 f"{undominated} of {len(rows)}")
    return lines


def table_lines(rows, roles):
    """The eta squared table with each head's role, for the printout and the map's header."""
    lines = ["layer head  " + " ".join(f"{a:>10}" for a in ATTRIBUTES) + "   entropy  dominant"
             + ("              role" if roles else "")]
    for layer, head, shares in rows:
        name, share, entropy = dominant(shares)
        line = (f"{layer:>5} {head:>4}  " + " ".join(f"{v:10.3f}" for v in shares)
                + f"   {entropy:7.3f}  {f'{name} ({share:.0%})':<18}")
        lines.append((line + f"{roles[layer, head]}" if roles else line).rstrip())
    return lines


def write_role_map(path, args, depth, num_heads, rows, roles):
    """Write the role map with a header holding the table, the rule and the command."""
    layers = sorted({layer for layer, _, _ in rows})
    role_map = RoleMap(
        num_layers=depth, num_heads=num_heads, attributes=tuple(args.attributes),
        roles={layer: tuple(roles[layer, head] for head in range(num_heads)) for layer in layers},
        backbone=model_file_label(args.config), weights=model_file_label(args.weights),
    )
    command = "python tools/synthetic_head_roles.py " + " ".join(shlex.quote(a) for a in args.argv)
    header = [
        f"Head roles of the project's tiny synthetic CLIP ({role_map.backbone} +",
        f"{role_map.weights}), layers {layers[0]}-{layers[-1]}, from ground-truth attribute statistics",
        "(no text corpus, no downstream labels), written by:",
        "",
        f"  {command}",
        "",
        f"eta squared of each head's direct contribution per attribute ({args.num_images} pretraining-style",
        "images; dominant: the attribute with the largest share of the row's sum):",
        "",
        *(f"  {line}" for line in table_lines(rows, roles)),
        "",
        f"Rule: a head whose dominant attribute has at least {args.dominance:.0%} of its row's sum is",
        f"specialised (A for the DeAR attributes {', '.join(args.attributes)};",
        f"O otherwise); of the others, the {args.generalization_share:.0%} of all heads (rounded down) with",
        "the highest entropy are generalization heads (G), the rest mixed (M). Layers 1-indexed,",
        "heads 0-indexed. An attribute without a specialised head has no core head.",
    ]
    text = "".join(f"# {line}".rstrip() + "\n" for line in header) + role_map.to_yaml()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_text(text, path)
    return role_map


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--weights", default=WEIGHTS)
    parser.add_argument("--layers", type=int, default=3, help="number of last layers to analyse")
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="", help="write the role map to this YAML file (default: table only)")
    parser.add_argument("--attributes", nargs="+", default=list(DEAR_ATTRIBUTES),
                        help="DeAR attributes: their specialised heads are A heads (default: DeAR's five)")
    parser.add_argument("--dominance", type=float, default=0.4,
                        help="least share of the dominant attribute for a specialised head (default 0.4)")
    parser.add_argument("--generalization-share", type=float, default=0.2,
                        help="share of all heads that become generalization heads (default 0.2)")
    args = parser.parse_args(argv)
    args.argv = argv
    if not 0 < args.dominance <= 1:
        parser.error(f"--dominance must be in (0, 1], got {args.dominance}")
    if not 0 <= args.generalization_share <= 1:
        parser.error(f"--generalization-share must be in [0, 1], got {args.generalization_share}")

    depth, num_heads, rows = head_statistics(args.config, args.weights, args.layers, args.num_images, args.seed)
    roles = assign_roles(rows, args.attributes, args.dominance, args.generalization_share) if args.output else {}
    print(f"eta^2 of each head's direct contribution per attribute ({args.num_images} pretraining-style images)")
    for line in table_lines(rows, roles) + summary_lines(rows, args.dominance):
        print(line)
    if args.output:
        write_role_map(args.output, args, depth, num_heads, rows, roles)
        print(f"Role map: {args.output}")


if __name__ == "__main__":
    main()
