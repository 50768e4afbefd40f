"""Reports of a head-role discovery: Markdown, CSV and a heat map (layers x heads).

The heat map needs matplotlib (part of the optional 'roles' extra); the Markdown and
CSV reports need nothing beyond the standard library. Every file is written atomically
(``vlprompt.utils.atomic_write``): an interrupted write leaves the previous file intact.
"""
import csv
from collections import Counter

from vlprompt.clip.head_roles import ROLE_KINDS
from vlprompt.utils import atomic_write, save_figure, write_text

from .embedders import OptionalDependencyError

__all__ = ["write_markdown", "write_csv", "write_heatmap", "role_counts"]

_TOP_PHRASES = 5


def role_counts(discovery):
    """Counter of role kinds ("A", "O", "G", "M") over the analysed heads."""
    return Counter(h.role.kind for h in discovery.heads)


def _cell(text):
    return str(text).replace("|", "\\|")


def write_markdown(discovery, path, title="Head roles"):
    """Write the Markdown report: settings, concepts, role grid and one row per head."""
    layers = sorted({h.layer for h in discovery.heads})
    num_heads = discovery.role_map.num_heads
    lines = [f"# {title}", ""]
    if discovery.settings:
        lines += ["| setting | value |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in discovery.settings.items()]
        lines.append("")
    counts = role_counts(discovery)
    lines += [
        "Roles: " + ", ".join(f"{ROLE_KINDS[k]} ({k}) {counts.get(k, 0)}" for k in ROLE_KINDS),
        "",
        "## Concepts",
        "",
        "| concept | phrases | examples |",
        "|---|---|---|",
    ]
    for name, members in zip(discovery.concepts.names, discovery.concepts.members):
        lines.append(f"| {_cell(name)} | {len(members)} | {_cell('; '.join(members[:4]))} |")
    lines += ["", "## Role map (layers x heads)", ""]
    lines.append("| layer | " + " | ".join(f"h{h}" for h in range(num_heads)) + " |")
    lines.append("|---|" + "---|" * num_heads)
    for layer in layers:
        row = [str(discovery.head(layer, h).role) for h in range(num_heads)]
        lines.append(f"| {layer} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Heads",
        "",
        "Entropy in nats over the concepts above (weighted: phrases weighted by the variance they "
        "explain, used to break entropy ties); share = fraction of the head's phrases in its dominant "
        "concept; phrases in TEXTSPAN order with the share of the head's variance each explains.",
        "",
        "| layer | head | role | entropy | weighted | dominant | share | top phrases |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in discovery.heads:
        top = "; ".join(f"{p} ({100 * e:.1f}%)" for p, e in zip(h.phrases[:_TOP_PHRASES], h.explained))
        lines.append(
            f"| {h.layer} | {h.head} | {h.role} | {h.entropy:.3f} | {h.weighted_entropy:.3f} | {_cell(h.dominant)} | "
            f"{h.distribution[h.dominant]:.2f} | {_cell(top)} |"
        )
    write_text("\n".join(lines) + "\n", path)


def write_csv(discovery, path):
    """Write one row per head: layer, head, role, entropies, dominant concept, one column
    per concept (fraction of phrases), and all phrases joined by " | "."""
    names = list(discovery.concepts.names)
    with atomic_write(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head", "role", "entropy", "weighted_entropy", "dominant"]
                        + [f"p_{n}" for n in names] + ["phrases"])
        for h in discovery.heads:
            writer.writerow(
                [h.layer, h.head, str(h.role), f"{h.entropy:.6f}", f"{h.weighted_entropy:.6f}", h.dominant]
                + [f"{h.distribution[n]:.4f}" for n in names]
                + [" | ".join(h.phrases)]
            )


def write_heatmap(discovery, path, title="Head roles"):
    """Write a PNG grid (layers x heads) coloured by role kind, each cell labelled with
    its concept and entropy.

    Raises:
        OptionalDependencyError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
    except ImportError as error:
        raise OptionalDependencyError(
            'The heat map needs matplotlib (optional \'roles\' extra: pip install -e ".[roles]").'
        ) from error
    kinds = list(ROLE_KINDS)
    colors = ["#d95f02", "#7570b3", "#1b9e77", "#bdbdbd"]  # A, O, G, M
    layers = sorted({h.layer for h in discovery.heads})
    num_heads = discovery.role_map.num_heads
    grid = [[kinds.index(discovery.head(layer, h).role.kind) for h in range(num_heads)] for layer in layers]
    figure, axes = plt.subplots(figsize=(1.1 * num_heads + 1.5, 0.9 * len(layers) + 1.6))
    axes.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=len(kinds) - 1, aspect="auto")
    for row, layer in enumerate(layers):
        for column in range(num_heads):
            summary = discovery.head(layer, column)
            concept = f"({summary.dominant}) " if summary.role.kind == "M" else ""
            label = f"{summary.role}\n{concept}H={summary.entropy:.2f}"
            axes.text(column, row, label, ha="center", va="center", fontsize=7)
    axes.set_xticks(range(num_heads), [str(h) for h in range(num_heads)])
    axes.set_yticks(range(len(layers)), [str(layer) for layer in layers])
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    axes.set_title(title)
    handles = [Patch(color=c, label=f"{k}: {ROLE_KINDS[k]}") for k, c in zip(kinds, colors)]
    axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8, frameon=False)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)
