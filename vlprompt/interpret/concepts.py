"""Concepts from head descriptions, and Concept Entropy (DeAR, section 3.2).

The phrases TEXTSPAN picks for all heads are embedded with a sentence-embedding model
and grouped into concepts, either by density clustering (HDBSCAN, as in the paper) or
by the concept label each description carries in the corpus. A concept is named, and
clusters that get the same name are merged, so a concept is one centroid per name.
Each head's phrases are then assigned to their nearest concept centroid (cosine); the
fractions give the head's concept distribution, whose Shannon entropy (natural log) is
the head's Concept Entropy.
"""
from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .embedders import OptionalDependencyError

__all__ = [
    "ConceptError", "ConceptSpace", "cluster_phrases", "name_clusters", "build_concept_space",
    "phrase_concepts", "concept_distribution", "concept_entropy", "dominant_concept",
]


class ConceptError(ValueError):
    """The phrases cannot be grouped into concepts (the message says why and what to change)."""


@dataclass
class ConceptSpace:
    """Named concepts in a sentence-embedding space.

    Attributes:
        names: K concept names.
        centroids: [K, d] unit-norm centroids.
        members: for each concept, the phrases that formed it.
    """

    names: Tuple[str, ...]
    centroids: torch.Tensor
    members: Tuple[Tuple[str, ...], ...]


def cluster_phrases(embeddings, min_cluster_size=3, min_samples=1):
    """HDBSCAN (scikit-learn >= 1.3) on unit-normalised embeddings [P, d].

    Euclidean distance between unit vectors is a monotone function of cosine distance.

    Returns:
        int array [P]: cluster id per phrase, -1 for noise.
    """
    try:
        from sklearn.cluster import HDBSCAN
    except ImportError as error:
        raise OptionalDependencyError(
            "Concept clustering with HDBSCAN needs scikit-learn >= 1.3 (part of the 'roles' extra: "
            "pip install -e \".[roles]\"). Without it, group phrases by their corpus labels "
            "(--concepts labels)."
        ) from error
    points = F.normalize(torch.as_tensor(embeddings, dtype=torch.float64), dim=-1).numpy()
    if len(points) < 2:
        return np.full(len(points), -1)
    clusterer = HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, copy=True)
    return clusterer.fit_predict(points)


def name_clusters(cluster_ids, embeddings, phrase_labels: Optional[Sequence[str]] = None,
                  names: Sequence[str] = (), name_embeddings=None):
    """Give each cluster a concept name.

    With ``phrase_labels`` (the corpus concept of every phrase) a cluster takes the most
    frequent label of its phrases (ties: the label that comes first in sorted order).
    Otherwise it takes the entry of ``names`` whose embedding (``name_embeddings``
    [K, d]) is closest (cosine) to the cluster's mean phrase embedding.

    Args:
        cluster_ids: [P] cluster id per phrase (-1 = noise, left unnamed).
        embeddings: [P, d] phrase embeddings.

    Returns:
        dict cluster id -> name.
    """
    embeddings = F.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=-1)
    cluster_ids = np.asarray(cluster_ids)
    named = {}
    for cluster in sorted(set(cluster_ids.tolist()) - {-1}):
        rows = np.flatnonzero(cluster_ids == cluster)
        if phrase_labels is not None:
            counts = Counter(phrase_labels[i] for i in rows)
            named[cluster] = min(counts, key=lambda label: (-counts[label], label))
        else:
            centre = F.normalize(embeddings[rows].mean(dim=0), dim=0)
            similarity = F.normalize(torch.as_tensor(name_embeddings, dtype=torch.float32), dim=-1) @ centre
            named[cluster] = names[int(similarity.argmax())]
    return named


def build_concept_space(phrases: Sequence[str], embeddings, cluster_ids, cluster_names):
    """Merge clusters by name into one centroid per concept.

    Args:
        phrases: P distinct phrases.
        embeddings: [P, d] their sentence embeddings.
        cluster_ids: [P] cluster id per phrase (-1 = noise, not part of any centroid).
        cluster_names: dict cluster id -> concept name.

    Returns:
        ConceptSpace with concepts ordered by first appearance in ``cluster_names``'s
        cluster order.
    """
    embeddings = F.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=-1)
    cluster_ids = np.asarray(cluster_ids)
    names = tuple(dict.fromkeys(cluster_names[c] for c in sorted(cluster_names)))
    if not names:
        raise ConceptError(
            f"No concept was found among the {len(phrases)} phrases (every phrase is noise to the "
            "clustering). Lower the minimum cluster size, pick more phrases per head, or group "
            "phrases by corpus labels."
        )
    centroids, members = [], []
    for name in names:
        rows = [i for i, c in enumerate(cluster_ids.tolist()) if c != -1 and cluster_names[c] == name]
        centroids.append(F.normalize(embeddings[rows].mean(dim=0), dim=0))
        members.append(tuple(phrases[i] for i in rows))
    return ConceptSpace(names=names, centroids=torch.stack(centroids), members=tuple(members))


def concept_distribution(assignments, num_concepts, weights=None):
    """Share of phrases assigned to each concept: [K] from [m] concept indices.

    Args:
        weights: optional [m] non-negative phrase weights (default: every phrase counts 1).
    """
    assignments = torch.as_tensor(assignments, dtype=torch.long)
    weights = None if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    mass = torch.bincount(assignments, weights=weights, minlength=num_concepts).double()
    total = float(mass.sum())
    return mass / total if total > 0 else mass


def concept_entropy(distribution):
    """Shannon entropy (nats) of a distribution [K]; 0 log 0 = 0."""
    p = torch.as_tensor(distribution, dtype=torch.float64)
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def dominant_concept(assignments, similarities, weights=None):
    """The most frequent concept of a head's phrases (or the heaviest, given ``weights``).

    Ties go to the concept with the larger summed similarity of its assigned phrases.

    Args:
        assignments: [m] concept index per phrase.
        similarities: [m] cosine similarity of each phrase to its assigned centroid.
        weights: optional [m] phrase weights (e.g. TEXTSPAN variance shares); the concept
            with the largest summed weight wins, the phrase count breaks ties.

    Returns:
        concept index.
    """
    assignments = torch.as_tensor(assignments, dtype=torch.long).tolist()
    similarities = torch.as_tensor(similarities, dtype=torch.float64).tolist()
    counts: Counter = Counter(assignments)
    closeness: Counter = Counter()
    for concept, similarity in zip(assignments, similarities):
        closeness[concept] += similarity
    mass: Counter = Counter()
    if weights is not None:
        for concept, weight in zip(assignments, torch.as_tensor(weights, dtype=torch.float64).tolist()):
            mass[concept] += weight
    return max(counts, key=lambda concept: (mass[concept], counts[concept], closeness[concept], -concept))


def phrase_concepts(space: ConceptSpace, embeddings) -> Tuple[List[int], List[float]]:
    """Nearest concept and its cosine similarity for each of [m, d] phrase embeddings."""
    similarity = F.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=-1) @ space.centroids.T
    best = similarity.max(dim=1)
    return best.indices.tolist(), best.values.tolist()
