"""Figures of the protocol runner's outputs (PNG; matplotlib is the optional "plots" extra).

    python tools/plot_results.py fewshot output --out figures/    # few-shot curves
    python tools/plot_results.py fusion output --out figures/     # DeAR fusion-weight heat map
    python tools/plot_results.py wiseft output --out figures/     # WiSE-FT: ID against OOD over alpha

``fewshot``: accuracy (mean over seeds, shaded ± std) against the number of shots, one
panel per dataset plus the Average over datasets, one line per method; methods evaluated
without training (shot count 0, e.g. ZeroshotCLIP) are a star at 0 shots, as in the CoOp and
DeAR figures. Writes ``fewshot.png`` (all panels) and ``fewshot_<panel>.png``.

``fusion``: DeAR's task-adaptive fusion weights softmax(a) (class feature and each
attribute) per dataset, read from the last checkpoint of each training run and averaged
over seeds, as a heat map (DeAR supplementary Figure 2). Writes ``fusion_weights.png`` and
prints the weights.

``wiseft``: WiSE-FT's mixing-coefficient curve (its Figure 1 layout): for every alpha of the
sweep, the mean over seeds of the ID accuracy (the fft source's test set) against the OOD
average (mean over the fft targets), read from the ``wiseft_alphas.json`` files the WiSEFT
runs of the fft protocol write (trainers/wiseft.py); alpha = 0 is the zero-shot model, 1 the
fine-tuned one. One line per WiSEFT config; writes ``wiseft.png`` and prints the points.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from vlprompt_app import results as parse_results
from vlprompt.paths import repository_root
from vlprompt.engine.run_folder import RunFolder
from vlprompt.run_layout import WISEFT_SWEEP_FILENAME
from vlprompt.fileio import save_figure
from vlprompt_app.protocols.benchmark import BenchmarkError, load_benchmark
from vlprompt_app.protocols.layout import parse_run_path
from vlprompt_app.protocols.tables import AVERAGE, mean_std, method_groups

REPO = repository_root()

Curve = List[Tuple[int, float, float]]
"""(shots, mean, std) points of one method in one panel, by shots."""

DEFAULT_COMPONENTS = ("CLS", "color", "shape", "texture", "object", "location")


class PlotError(Exception):
    """A problem the user can fix (missing matplotlib, no data, unreadable checkpoint)."""


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend; PlotError when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError('Plots need matplotlib, an optional dependency: pip install -e ".[plots]" '
                        "(or pip install matplotlib).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------- few-shot


def fewshot_curves(results: "parse_results.ProtocolResults", order: Sequence[str] = (),
                   select: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, Curve]]:
    """Panel (dataset, then "Average") -> method -> curve.

    A point of the Average panel is the mean over datasets of the per-dataset means, drawn
    only when the method has that shot count on every dataset of the figure.
    """
    groups = method_groups(results.measurements, select)
    datasets = [d for d in order if any(d == key[0] for g in groups for key in g.cells)]
    datasets += sorted({d for g in groups for d, _ in g.cells} - set(datasets))
    panels: Dict[str, Dict[str, Curve]] = {d: {} for d in datasets}
    panels[AVERAGE] = {}
    for group in groups:
        shots = sorted({int(column) for _, column in group.cells})
        for dataset in datasets:
            points = [(k, *mean_std(list(group.values(dataset, str(k)).values())))
                      for k in shots if group.values(dataset, str(k))]
            if points:
                panels[dataset][group.label] = points
        average = []
        for k in shots:
            means = [mean_std(list(group.values(d, str(k)).values()))[0] for d in datasets
                     if group.values(d, str(k))]
            if len(means) == len(datasets):
                average.append((k, sum(means) / len(means), math.nan))
        if average:
            panels[AVERAGE][group.label] = average
    return panels


def _draw_panel(axis, title: str, curves: Dict[str, Curve], positions: Dict[int, int]) -> None:
    for label, points in curves.items():
        xs = [positions[k] for k, _, _ in points]
        means = [m for _, m, _ in points]
        if len(points) == 1 and points[0][0] == 0:
            axis.plot(xs, means, marker="*", markersize=12, linestyle="none", label=label)
            continue
        line, = axis.plot(xs, means, marker="o", label=label)
        stds = [s for _, _, s in points]
        if not any(math.isnan(s) for s in stds):
            axis.fill_between(xs, [m - s for m, s in zip(means, stds)],
                              [m + s for m, s in zip(means, stds)], color=line.get_color(), alpha=0.2)
    axis.set_title(title)
    axis.set_xticks(list(positions.values()))
    axis.set_xticklabels([str(k) for k in positions])
    axis.set_xlabel("shots per class")
    axis.set_ylabel("accuracy (%)")
    axis.grid(alpha=0.3)


def plot_fewshot(panels: Dict[str, Dict[str, Curve]], out_dir: Path) -> List[Path]:
    """Write fewshot.png (Average first, then the datasets) and one PNG per panel."""
    plt = pyplot()
    shots = sorted({k for curves in panels.values() for points in curves.values() for k, _, _ in points})
    positions = {k: i for i, k in enumerate(shots)}  # evenly spaced 0, 1, 2, 4, 8, 16
    order = [AVERAGE] + [p for p in panels if p != AVERAGE]
    order = [p for p in order if panels[p]]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    columns = min(4, len(order))
    rows = math.ceil(len(order) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.4 * rows), squeeze=False)
    for axis, panel in zip(axes.flat, order):
        _draw_panel(axis, panel, panels[panel], positions)
    for axis in list(axes.flat)[len(order):]:
        axis.axis("off")
    axes.flat[0].legend(fontsize="small")
    figure.tight_layout()
    written.append(out_dir / "fewshot.png")
    save_figure(figure, str(written[-1]), dpi=120)
    plt.close(figure)
    for panel in order:
        figure, axis = plt.subplots(figsize=(4.5, 3.6))
        _draw_panel(axis, panel, panels[panel], positions)
        axis.legend(fontsize="small")
        figure.tight_layout()
        written.append(out_dir / f"fewshot_{panel.lower()}.png")
        save_figure(figure, str(written[-1]), dpi=120)
        plt.close(figure)
    return written


# ----------------------------------------------------------------------------- fusion


def _last_checkpoint(run: Path, model_name: str) -> Optional[Path]:
    """The checkpoint of ``model_name`` after the most epochs in the run folder ``run``, or None."""
    by_epoch = {epochs: path for (epochs, batches), path in RunFolder(run).checkpoints(model_name).items()
                if batches == 0}
    return by_epoch[max(by_epoch)] if by_epoch else None


def fusion_weights(directory, trainer: str = "DeAR", kinds: Sequence[str] = ("train_base",),
                   key: str = "fusion_logits", model_name: str = "prompt_learner",
                   seeds: Optional[Sequence[str]] = None) -> Dict[str, List[float]]:
    """Dataset -> fusion weights softmax(a) averaged over seeds (one value per component).

    Reads the highest ``model.pth.tar-N`` under ``RUN/<model_name>/`` of every training run of
    ``trainer`` whose layout kind is in ``kinds`` ("train_base": base-to-novel, "train":
    few-shot and cross-dataset sources), and the state-dict entry whose name ends in ``key``.

    Raises:
        PlotError: no such run, or a checkpoint without the entry.
    """
    import torch

    from vlprompt.utils import load_checkpoint

    root = parse_results.require_directory(directory)
    per_dataset: Dict[str, List[List[float]]] = {}
    for run in parse_results.find_runs(root):
        run_key = parse_run_path(run.path.relative_to(root).parts)
        if (run_key is None or run_key.trainer != trainer or run_key.kind not in kinds
                or (seeds is not None and run_key.seed not in seeds)):
            continue
        checkpoint = _last_checkpoint(run.path, model_name)
        if checkpoint is None:
            continue
        state = load_checkpoint(str(checkpoint))["state_dict"]
        names = [name for name in state if name == key or name.endswith("." + key)]
        if len(names) != 1:
            raise PlotError(f"{checkpoint} has {len(names)} state-dict entries named '{key}' "
                            f"(entries: {', '.join(sorted(state))}); pass --key.")
        weights = torch.as_tensor(state[names[0]]).float().softmax(0).tolist()
        per_dataset.setdefault(run_key.dataset, []).append(weights)
    if not per_dataset:
        raise PlotError(f"No checkpoint of a {trainer} training run ({', '.join(kinds)}) under {root}.")
    return {d: [sum(column) / len(column) for column in zip(*runs)] for d, runs in per_dataset.items()}


def plot_fusion(weights: Dict[str, List[float]], components: Sequence[str], out_dir: Path,
                order: Sequence[str] = ()) -> Path:
    """Heat map datasets x components of the fusion weights (darker = larger)."""
    sizes = {len(w) for w in weights.values()}
    if sizes != {len(components)}:
        raise PlotError(f"The fusion weights have {sorted(sizes)} entries but {len(components)} "
                        f"component names were given ({', '.join(components)}); pass --components "
                        "(the class feature first, then TRAINER.DEAR.ATTRIBUTES).")
    plt = pyplot()
    datasets = [d for d in order if d in weights] + sorted(set(weights) - set(order))
    matrix = [weights[d] for d in datasets]
    figure, axis = plt.subplots(figsize=(1.1 * len(components) + 2.5, 0.45 * len(datasets) + 1.5))
    image = axis.imshow(matrix, cmap="Blues", aspect="auto")
    axis.set_xticks(range(len(components)))
    axis.set_xticklabels(components)
    axis.set_yticks(range(len(datasets)))
    axis.set_yticklabels(datasets)
    for row, values in enumerate(matrix):
        for column, value in enumerate(values):
            axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize="small",
                      color="white" if value > 0.6 * max(max(r) for r in matrix) else "black")
    figure.colorbar(image, ax=axis, label="fusion weight")
    axis.set_title("Task-adaptive fusion weights")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fusion_weights.png"
    save_figure(figure, str(path), dpi=120)
    plt.close(figure)
    return path


# ----------------------------------------------------------------------------- WiSE-FT

WiseCurve = List[Tuple[float, float, float]]
"""(alpha, ID accuracy, OOD average) points of one WiSEFT config, by alpha (means over seeds)."""


def wiseft_curves(directory, source: str, targets: Sequence[str], trainer: str = "WiSEFT",
                  seeds: Optional[Sequence[str]] = None) -> Dict[str, WiseCurve]:
    """Config -> the alpha curve of the fft runs of ``trainer`` under ``directory``.

    A seed counts when its source run and every target's evaluation hold a sweep file with the
    same alphas. Raises PlotError when no seed is complete.
    """
    root = parse_results.require_directory(directory)
    sweeps: Dict[Tuple[str, str], Dict[str, Dict[float, float]]] = {}  # (config, seed) -> dataset -> alpha -> acc
    for run in parse_results.find_runs(root):
        key = parse_run_path(run.path.relative_to(root).parts)
        path = RunFolder(run.path).wiseft_sweep_path
        if key is None or key.trainer != trainer or not path.is_file() or (seeds is not None and key.seed not in seeds):
            continue
        if (key.kind, key.dataset) != ("train", source) and (key.kind != "evaluation" or key.dataset not in targets):
            continue
        points = json.loads(path.read_text())["points"]
        sweeps.setdefault((key.cfg, key.seed), {})[key.dataset] = {p["alpha"]: p["accuracy"] for p in points}
    per_config: Dict[str, List[Dict[float, Tuple[float, float]]]] = {}
    for (config, _), by_dataset in sorted(sweeps.items()):
        alphas = {tuple(sorted(values)) for values in by_dataset.values()}
        if set(by_dataset) != {source, *targets} or len(alphas) != 1:
            continue
        per_config.setdefault(config, []).append({
            alpha: (by_dataset[source][alpha], sum(by_dataset[t][alpha] for t in targets) / len(targets))
            for alpha in next(iter(alphas))
        })
    if not per_config:
        raise PlotError(f"No {trainer} fft run under {root} with a {WISEFT_SWEEP_FILENAME} for the source ({source}) "
                        f"and every target ({', '.join(targets)}).")
    return {config: [(alpha, mean_std([run[alpha][0] for run in runs])[0], mean_std([run[alpha][1] for run in runs])[0])
                     for alpha in sorted(runs[0])]
            for config, runs in per_config.items()}


def plot_wiseft(curves: Dict[str, WiseCurve], out_dir: Path, source: str) -> Path:
    """ID accuracy (x) against OOD average (y), one line per config, each point labelled with alpha."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5.5, 4.5))
    for config, points in curves.items():
        xs, ys = [p[1] for p in points], [p[2] for p in points]
        axis.plot(xs, ys, marker="o", label=f"WiSE-FT ({config})")
        for alpha, x, y in points:
            axis.annotate(f"{alpha:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        axis.scatter([xs[0]], [ys[0]], marker="*", s=140, zorder=3, color="black",
                     label="zero-shot (alpha 0)" if config == next(iter(curves)) else None)
        axis.scatter([xs[-1]], [ys[-1]], marker="s", s=50, zorder=3, color="gray",
                     label="fine-tuned (alpha 1)" if config == next(iter(curves)) else None)
    axis.set_xlabel(f"ID accuracy ({source}, %)")
    axis.set_ylabel("OOD average accuracy (%)")
    axis.set_title("WiSE-FT: weight-space ensembles")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "wiseft.png"
    save_figure(figure, str(path), dpi=120)
    plt.close(figure)
    return path


# -------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("figure", choices=("fewshot", "fusion", "wiseft"))
    parser.add_argument("directory", help="output root of tools/run_protocol.py")
    parser.add_argument("--out", default="figures", help="folder for the PNG files (default: figures)")
    parser.add_argument("--benchmark", default="paper", help="benchmark giving the dataset order")
    parser.add_argument("--trainers", nargs="+", metavar="TRAINER[:CFG]",
                        help="fewshot: methods to draw, in this order")
    parser.add_argument("--seeds", nargs="+", help="only these seeds")
    parser.add_argument("--trainer", default="DeAR", help="fusion: the trainer (default DeAR)")
    parser.add_argument("--protocol", choices=("base2new", "fewshot"), default="base2new",
                        help="fusion: runs of this protocol (default base2new: train_base runs)")
    parser.add_argument("--key", default="fusion_logits", help="fusion: state-dict entry of the logits a")
    parser.add_argument("--components", nargs="+", default=list(DEFAULT_COMPONENTS),
                        help="fusion: names of the weights (class feature, then the attributes)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out)
    try:
        benchmark = load_benchmark(args.benchmark, REPO / "configs")
        if args.figure == "fewshot":
            order = benchmark.protocols["fewshot"].datasets if "fewshot" in benchmark.protocols else ()
            results = parse_results.collect_measurements(args.directory, "fewshot", seeds=args.seeds)
            if not results.measurements.values:
                raise PlotError(f"No completed few-shot run under {args.directory}.")
            select = [t for value in args.trainers or () for t in value.split(",") if t] or None
            for path in plot_fewshot(fewshot_curves(results, order, select), out_dir):
                print(f"Wrote {path}")
            return 0
        if args.figure == "wiseft":
            if "fft" not in benchmark.protocols:
                raise PlotError(f"The benchmark '{args.benchmark}' has no fft protocol (its source and targets).")
            fft = benchmark.protocols["fft"]
            curves = wiseft_curves(args.directory, fft.source, fft.datasets, seeds=args.seeds)
            path = plot_wiseft(curves, out_dir, fft.source)
            for config, points in curves.items():
                print(f"WiSEFT ({config}): alpha, ID ({fft.source}), OOD average ({', '.join(fft.datasets)})")
                for alpha, id_accuracy, ood in points:
                    print(f"  {alpha:4.2f}  {id_accuracy:6.2f}  {ood:6.2f}")
            print(f"Wrote {path}")
            return 0
        kinds = ("train_base",) if args.protocol == "base2new" else ("train",)
        order = benchmark.protocols[args.protocol].datasets if args.protocol in benchmark.protocols else ()
        weights = fusion_weights(args.directory, args.trainer, kinds, args.key, seeds=args.seeds)
        path = plot_fusion(weights, args.components, out_dir, order)
        width = max(len(d) for d in weights)
        print(" " * width + "  " + "  ".join(f"{c:>8}" for c in args.components))
        for dataset in [d for d in order if d in weights] + sorted(set(weights) - set(order)):
            print(f"{dataset:<{width}}  " + "  ".join(f"{w:8.3f}" for w in weights[dataset]))
        print(f"Wrote {path}")
        return 0
    except (PlotError, BenchmarkError, parse_results.ResultsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
