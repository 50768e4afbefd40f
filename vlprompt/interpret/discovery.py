"""Head-role discovery: decomposition -> TEXTSPAN -> concepts -> Concept Entropy -> roles.

:func:`collect_head_contributions` runs the images once; :func:`discover_roles` does the
rest from the contributions and the corpus, so the text side can be re-run cheaply.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from vlprompt.clip.head_roles import HeadRole, RoleMap

from .concepts import (
    ConceptError, ConceptSpace, build_concept_space, cluster_phrases, concept_distribution, concept_entropy,
    dominant_concept, name_clusters, phrase_concepts,
)
from .corpus import Corpus
from .decomposition import decompose_image_features
from .roles import quantile_roles
from .textspan import textspan

__all__ = [
    "CONCEPT_NAMES", "DEAR_ATTRIBUTES", "HeadSummary", "RoleDiscovery", "collect_head_contributions",
    "SCORINGS", "discover_roles",
]

# The twelve concept clusters the DeAR paper reports, and its five core attributes.
CONCEPT_NAMES = ("location", "object", "color", "shape", "texture", "animal", "human", "text",
                 "number", "style", "emotion", "action")
DEAR_ATTRIBUTES = ("color", "shape", "texture", "object", "location")


@dataclass
class HeadSummary:
    """What discovery found for one head.

    Attributes:
        layer: 1-indexed layer; head: 0-indexed head.
        phrases: the TEXTSPAN picks, in order; explained: variance share of each pick.
        phrase_concepts: the concept each phrase was assigned to.
        distribution: concept -> fraction of the phrases (every concept of the space).
        entropy: Concept Entropy (nats); weighted_entropy: entropy of the concept shares
            weighted by each phrase's variance share. The scoring (``discover_roles``) ranks
            heads by one and breaks ties by the other.
        dominant: most frequent concept (scoring "weighted": the largest variance share).
        role: HeadRole, assigned once the entropies of all heads are known.
    """

    layer: int
    head: int
    phrases: List[str]
    explained: List[float]
    phrase_concepts: List[str]
    distribution: Dict[str, float]
    entropy: float
    weighted_entropy: float
    dominant: str
    role: Optional[HeadRole] = None


@dataclass
class RoleDiscovery:
    """Result of :func:`discover_roles` (heads in layer-major order)."""

    heads: List[HeadSummary]
    concepts: ConceptSpace
    role_map: RoleMap
    settings: Dict[str, object] = field(default_factory=dict)

    def head(self, layer, head):
        return next(h for h in self.heads if (h.layer, h.head) == (layer, head))


@torch.no_grad()
def collect_head_contributions(visual, batches, num_layers, device="cpu"):
    """Per-head direct contributions of the last ``num_layers`` blocks.

    Args:
        visual: the runner's VisionTower.
        batches: iterable of [B, 3, H, W] image tensors (or dicts with key "img").
        num_layers: how many of the last blocks to analyse.

    Returns:
        [N, num_layers, H, E] float32 tensor on the CPU.
    """
    chunks = []
    for batch in batches:
        images = batch["img"] if isinstance(batch, dict) else batch
        decomposition = decompose_image_features(visual, images.to(device), num_layers)
        chunks.append(decomposition.heads.float().cpu())
    if not chunks:
        raise ValueError("No images to decompose: the image source is empty.")
    return torch.cat(chunks)


def _group_phrases(embeddings, labels, concepts, min_cluster_size, min_samples, concept_names, embed,
                   corpus_source):
    """Cluster ids and names of the unique phrases (see discover_roles)."""
    if concepts == "labels":
        if labels is None:
            raise ConceptError(
                f"Grouping phrases by corpus labels (--concepts labels) needs a labelled corpus: {corpus_source} "
                "has no labels (use a .tsv file with concept<TAB>description lines, or --concepts hdbscan)."
            )
        names = sorted(set(labels))
        cluster_ids = np.array([names.index(label) for label in labels])
        return cluster_ids, dict(enumerate(names))
    if concepts != "hdbscan":
        raise ConceptError(f"Unknown concept grouping '{concepts}'; expected 'hdbscan' or 'labels'.")
    cluster_ids = cluster_phrases(embeddings, min_cluster_size=min_cluster_size, min_samples=min_samples)
    name_embeddings = None if labels is not None else embed(list(concept_names))
    names = name_clusters(cluster_ids, embeddings, phrase_labels=labels, names=concept_names,
                          name_embeddings=name_embeddings)
    return cluster_ids, names


SCORINGS = ("count", "weighted")


def discover_roles(contributions, layers: Sequence[int], corpus: Corpus, text_embeddings,
                   embed: Callable[[List[str]], torch.Tensor], num_layers_total: int,
                   num_texts=20, concepts="hdbscan", min_cluster_size=3, min_samples=1,
                   concept_names: Sequence[str] = CONCEPT_NAMES,
                   attributes: Sequence[str] = DEAR_ATTRIBUTES, quantile=0.2, scoring="count",
                   backbone="", weights="", notes="", progress: Optional[Callable[[str], None]] = None):
    """Roles of every analysed head.

    Args:
        contributions: [N, n, H, E] per-head direct contributions.
        layers: the n analysed layers, 1-indexed.
        corpus: the description pool; text_embeddings: [M, E] its CLIP text embeddings.
        embed: sentence embedder (list of P phrases -> [P, d]).
        num_layers_total: depth of the image tower (for the role map).
        num_texts: phrases per head (m).
        concepts: "hdbscan" (cluster the phrases) or "labels" (group them by corpus label).
        min_cluster_size, min_samples: HDBSCAN parameters.
        concept_names: names given to clusters when the corpus has no labels.
        attributes: core attributes (A roles); quantile: share of heads in each tail.
        scoring: what ranks the heads and names their dominant concept. "count" (the
            paper): Concept Entropy of the phrase counts, ties broken by the weighted
            entropy; the most frequent concept. "weighted": the entropy of the concept
            shares weighted by each phrase's TEXTSPAN variance share, ties broken by the
            count entropy; the concept with the largest variance share.
        backbone, weights, notes: informative fields of the role map.
        progress: optional callable receiving one-line progress messages.

    Returns:
        RoleDiscovery.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"Unknown head scoring {scoring!r}; expected one of {', '.join(SCORINGS)}.")
    say = progress or (lambda message: None)
    num_heads = contributions.shape[2]
    spans = {}
    for i, layer in enumerate(layers):
        for head in range(num_heads):
            spans[layer, head] = textspan(contributions[:, i, head], text_embeddings, num_texts=num_texts)
        say(f"TEXTSPAN: layer {layer} done")

    unique = sorted({index for span in spans.values() for index in span.indices})
    phrases = [corpus.texts[i] for i in unique]
    labels = None if corpus.labels is None else [corpus.labels[i] for i in unique]
    embeddings = embed(phrases)
    cluster_ids, cluster_names = _group_phrases(embeddings, labels, concepts, min_cluster_size, min_samples,
                                                concept_names, embed, corpus.source)
    space = build_concept_space(phrases, embeddings, cluster_ids, cluster_names)
    say(f"Concepts: {len(space.names)} ({', '.join(space.names)}) from {len(phrases)} distinct phrases")
    nearest, similarity = phrase_concepts(space, embeddings)
    row_of = {index: row for row, index in enumerate(unique)}

    heads = []
    for (layer, head), span in spans.items():
        rows = [row_of[i] for i in span.indices]
        assigned = [nearest[r] for r in rows]
        distribution = concept_distribution(assigned, len(space.names))
        weighted = concept_distribution(assigned, len(space.names), weights=span.explained)
        dominant = space.names[dominant_concept(assigned, [similarity[r] for r in rows],
                                                weights=span.explained if scoring == "weighted" else None)]
        heads.append(HeadSummary(
            layer=layer, head=head, phrases=[corpus.texts[i] for i in span.indices],
            explained=list(span.explained), phrase_concepts=[space.names[a] for a in assigned],
            distribution={name: float(p) for name, p in zip(space.names, distribution)},
            entropy=concept_entropy(distribution), weighted_entropy=concept_entropy(weighted),
            dominant=dominant,
        ))
    scores = [(h.entropy, h.weighted_entropy) for h in heads]
    if scoring == "weighted":
        scores = [(weighted, count) for count, weighted in scores]
    roles = quantile_roles([primary for primary, _ in scores], [h.dominant for h in heads], attributes, quantile,
                           tie_breaks=[secondary for _, secondary in scores])
    for summary, role in zip(heads, roles):
        summary.role = role
    role_map = RoleMap(
        num_layers=num_layers_total, num_heads=num_heads, attributes=tuple(attributes),
        roles={layer: tuple(h.role for h in heads if h.layer == layer) for layer in layers},
        backbone=backbone, weights=weights, notes=notes,
    )
    return RoleDiscovery(heads=heads, concepts=space, role_map=role_map)
