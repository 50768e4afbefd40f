"""TEXTSPAN: describe a head's output space with a few texts (Gandelsman et al., ICLR 2024).

Given a head's direct contributions C [N, E] over N images and a pool of text
embeddings T [M, E] in the same joint space, pick texts greedily: at each step take the
text whose embedding direction explains the most variance of the mean-centred
contributions, then project that direction out of the contributions and out of every
remaining text embedding, so the next pick explains what is left.

With ``S = Cc^T Cc`` (Cc the centred contributions) the variance along a unit direction
u is ``u^T S u``. Projecting u out of both C and T leaves ``t'^T S' t' = t'^T S t'`` for
every projected text t' (the projector is idempotent), so S is computed once and only
the texts are updated; ``A = T S`` is kept up to date with a rank-one correction, so a
step costs O(M E) after an O(M E^2) start.
"""
from dataclasses import dataclass
from typing import List

import torch

__all__ = ["SpanResult", "textspan"]


@dataclass
class SpanResult:
    """Texts picked for one head.

    Attributes:
        indices: positions in the text pool, in the order picked.
        explained: for each pick, the fraction of the head's total variance its
            direction removed (the picked directions are orthonormal, so these sum to at
            most 1; a later pick can explain more than an earlier one, because removing a
            direction turns every remaining text).
    """

    indices: List[int]
    explained: List[float]


@torch.no_grad()
def textspan(contributions, text_embeddings, num_texts=20, min_residual=0.05):
    """Greedy TEXTSPAN decomposition of one head.

    Args:
        contributions: [N, E] the head's direct contributions for N images.
        text_embeddings: [M, E] text embeddings (any norm; directions are used).
        num_texts: how many texts to pick (m).
        min_residual: a text whose remaining norm falls below this fraction of its
            original norm is no longer picked (its direction would be numerical noise).

    Returns:
        SpanResult with up to ``num_texts`` picks (fewer if no usable text is left).
    """
    data = contributions.double()
    data = data - data.mean(dim=0, keepdim=True)
    scatter = data.T @ data
    total = float(scatter.trace())
    texts = text_embeddings.double().clone()
    floor = (min_residual * texts.norm(dim=1)) ** 2
    product = texts @ scatter  # A = T S
    available = torch.ones(texts.shape[0], dtype=torch.bool, device=texts.device)
    indices, explained = [], []
    for _ in range(num_texts):
        norms = texts.pow(2).sum(dim=1)
        usable = available & (norms > floor) & (norms > 0)
        if not usable.any() or total <= 0:
            break
        scores = (product * texts).sum(dim=1) / norms.clamp_min(torch.finfo(norms.dtype).tiny)
        scores[~usable] = float("-inf")
        pick = int(scores.argmax())
        direction = texts[pick] / norms[pick].sqrt()
        indices.append(pick)
        explained.append(float(scores[pick]) / total)
        available[pick] = False
        along = texts @ direction  # [M]
        texts -= along[:, None] * direction[None, :]
        product -= along[:, None] * (scatter @ direction)[None, :]
    return SpanResult(indices=indices, explained=explained)
