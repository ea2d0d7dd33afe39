"""BNE's three objectives (Phan et al. 2019, section 3.2), as logistic losses on dot products.

With ℓ(x) = log(1 + e^-x) and, for each anchor name s of a mini-batch, one negative drawn from the batch per
objective (another anchor whose concept differs):

- synonym similarity  L_syn = ℓ(f(s')ᵀf(s)) + ℓ(-f(s̄)ᵀf(s)), s' a synonym of s, s̄ a negative name;
- conceptual meaning  L_def = ℓ(g(c)ᵀf(s)) + ℓ(-g(c̄)ᵀf(s)), g(c) the concept's representation;
- contextual meaning  L_ctx = ℓ(q(s)ᵀf(s)) + ℓ(-q(s̄)ᵀf(s)), q(s) the name's contextual representation.

L_BNE = L_syn + L_def + L_ctx, unweighted as in the paper. This is the paper's option 2 (BNE + SGW), the one that
needs only word vectors and a dictionary: q(s) is the mean pre-trained vector of the words of s, and g(c) the mean
of q over the names of c.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

OBJECTIVES = ("syn", "def", "ctx")


def logistic(x: torch.Tensor) -> torch.Tensor:
    """ℓ(x) = log(1 + exp(-x)), computed stably."""
    return F.softplus(-x)


def draw_negatives(concepts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """For each anchor, another position of the batch, and whether its concept differs (else it is no negative)."""
    n = len(concepts)
    if n < 2:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    other = (np.arange(n) + rng.integers(1, n, size=n)) % n  # uniform over the other positions
    return other, concepts[other] != concepts


def bne_losses(
    f_s: torch.Tensor,
    f_pos: torch.Tensor,
    has_synonym: torch.Tensor,
    q_s: torch.Tensor,
    g_c: torch.Tensor,
    negatives: dict[str, tuple[np.ndarray, np.ndarray]],
    objectives: tuple[str, ...] = OBJECTIVES,
) -> dict[str, torch.Tensor]:
    """Mean loss per objective over a batch.

    f_s (torch.Tensor): (batch, dim) f(s) of the anchors.
    f_pos (torch.Tensor): (batch, dim) f(s') of their synonyms.
    has_synonym (torch.Tensor): (batch,) bool; False drops the synonym (positive) term of that anchor.
    q_s (torch.Tensor): (batch, dim) q(s) of the anchors.
    g_c (torch.Tensor): (batch, dim) g(c) of the anchors' concepts.
    negatives (Dict[str, Tuple[np.ndarray, np.ndarray]]): Per objective, from `draw_negatives`.
    objectives (Tuple[str, ...]): Which of "syn", "def", "ctx" to compute.
    """
    targets = {"syn": f_s, "def": g_c, "ctx": q_s}  # the negative of each objective is taken from these rows
    out = {}
    for name in objectives:
        other, valid = negatives[name]
        positive_target = {"syn": f_pos, "def": g_c, "ctx": q_s}[name]
        pos = logistic((positive_target * f_s).sum(-1))
        if name == "syn":
            pos = pos * has_synonym.float()
        other_t, valid_t = torch.from_numpy(other).to(f_s.device), torch.from_numpy(valid).to(f_s.device)
        neg = logistic(-(targets[name][other_t] * f_s).sum(-1)) * valid_t.float()
        out[name] = (pos + neg).mean()
    return out
