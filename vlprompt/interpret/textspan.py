"""TEXTSPAN: describe a head's output space with a few texts (Gandelsman et al., ICLR 2024).

Given a head's direct contributions C [N, E] over N images and a pool of text
embeddings T [M, E] in the same joint space, pick texts greedily: at each step take the
text whose embedding direction explains the most variance of the mean-centred
contributions, then project that direction out of the contributions and out of every
remaining text embedding, so the next pick explains what is left.

With ``S = Cc^T Cc`` (Cc the centred contributions) the variance along a unit direction
u is ``u^T S u``. After k picks with orthonormal directions U, the remaining text i is
``t_i' = P t_i`` (P = I - U U^T) and the remaining contributions are ``Cc P``; because P
is an idempotent projector, their variance along ``t_i'`` is ``t_i'^T S t_i'``. So S is
computed once, the text pool is never rewritten, and each text's score
``q_i = t_i'^T S t_i'`` and squared norm ``|t_i'|^2`` follow rank-one updates: picking
u with a = T' u and s = S u gives ``q <- q - 2 a (T' s) + a^2 (u^T s)`` and
``|t'|^2 <- |t'|^2 - a^2``, where ``T' x = T x - (T U)(U^T x)``. A step costs two
matrix-vector products with the pool, after an O(M E^2) start.
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
    scatter = data.T @ data  # S [E, E]
    total = float(scatter.trace())
    pool = text_embeddings.double()  # T [M, E], never modified
    norms = pool.pow(2).sum(dim=1)  # |t'|^2
    floor = min_residual ** 2 * norms
    scores = ((pool @ scatter) * pool).sum(dim=1)  # q = t'^T S t'
    basis = pool.new_zeros(pool.shape[1], 0)  # U [E, k]
    pool_basis = pool.new_zeros(pool.shape[0], 0)  # T U [M, k]
    available = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    indices, explained = [], []
    for _ in range(num_texts):
        usable = available & (norms > floor) & (norms > 0)
        if not usable.any() or total <= 0:
            break
        variance = torch.where(usable, scores / norms.clamp_min(torch.finfo(norms.dtype).tiny), float("-inf"))
        pick = int(variance.argmax())
        remaining = pool[pick] - basis @ pool_basis[pick]
        direction = remaining / remaining.norm()
        indices.append(pick)
        explained.append(float(variance[pick]) / total)
        available[pick] = False
        along = pool @ direction  # a = T' u = T u, as u is orthogonal to U
        image = scatter @ direction  # s = S u
        projected_image = pool @ image - pool_basis @ (basis.T @ image)  # T' s
        scores = scores - 2 * along * projected_image + along.pow(2) * float(direction @ image)
        norms = norms - along.pow(2)
        basis = torch.cat([basis, direction[:, None]], dim=1)
        pool_basis = torch.cat([pool_basis, along[:, None]], dim=1)
    return SpanResult(indices=indices, explained=explained)
