"""Head roles from Concept Entropy by quantile (DeAR, section 3.2 and supp. B).

Of the n analysed heads, the k = min(floor(q n + 1/2), floor(n / 2)) with the lowest
entropy are specialised and the k with the highest are generalization heads; the rest
are mixed. Concept Entropy over m phrases takes few distinct values, so ties are common;
they are broken by a secondary score (under the paper's count scoring the discovery passes
the entropy of the concept distribution weighted by each phrase's TEXTSPAN variance share:
among equally mixed heads, the one whose strongest directions agree is the more
specialised; its "weighted" scoring swaps the two), then by head order. A specialised
head is a core attribute head (``A``) when its dominant concept is one of the attributes,
otherwise an other-specialised head (``O``). Generalization heads keep their dominant
concept for the record (``G style``).
"""
import math
from typing import Optional, Sequence

from vlprompt.clip.head_roles import HeadRole

__all__ = ["quantile_roles"]


def quantile_roles(entropies: Sequence[float], dominants: Sequence[str], attributes: Sequence[str],
                   quantile=0.2, tie_breaks: Optional[Sequence[float]] = None):
    """Roles of n heads (see the module docstring).

    Args:
        entropies: n Concept Entropies.
        dominants: n dominant concept names.
        attributes: the core attributes (names a specialised head needs to be ``A``).
        quantile: q in (0, 0.5], the share of heads in each tail.
        tie_breaks: n secondary scores ordering heads of equal entropy (lower = more
            specialised); None: head order only.

    Returns:
        list of n HeadRole.
    """
    if not 0 < quantile <= 0.5:
        raise ValueError(f"The entropy quantile must be in (0, 0.5] (share of heads in each tail), got {quantile}.")
    n = len(entropies)
    tie_breaks = [0.0] * n if tie_breaks is None else list(tie_breaks)
    if not len(dominants) == len(tie_breaks) == n:
        raise ValueError(f"Got {n} entropies, {len(dominants)} dominant concepts and {len(tie_breaks)} tie-break scores.")
    k = min(math.floor(quantile * n + 0.5), n // 2)
    order = sorted(range(n), key=lambda i: (entropies[i], tie_breaks[i], i))
    specialised, general = set(order[:k]), set(order[n - k:])
    roles = []
    for i, concept in enumerate(dominants):
        if i in specialised:
            roles.append(HeadRole("A" if concept in attributes else "O", concept))
        elif i in general:
            roles.append(HeadRole("G", concept))
        else:
            roles.append(HeadRole("M"))
    return roles
