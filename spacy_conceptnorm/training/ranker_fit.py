"""Fitting the second-stage ranker (`linking.ranker.Ranker`): its pair scorers, then its listwise model.

`fit_pair_scorer` trains one pair scorer on ranking groups by its trainer (`cnn_fit`, `cross_encoder_fit`);
`fit_ranker` then fits the conditional logit over the candidate features and the scorers' columns.
`training.ranking.train_ranker` builds the examples and calls both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..errors import ConceptNormError, Errors
from ..linking.candidates import CandidateSet
from ..linking.cnn_ranker import CNNRanker
from ..linking.cross_encoder import CrossEncoderRanker
from ..linking.pair_scorer import PairScorer, RankingGroup
from ..linking.ranker import Ranker
from .cnn_fit import fit_cnn
from .cross_encoder_fit import fit_cross_encoder
from .pair_scorer_fit import FitReport


def fit_pair_scorer(
    scorer: PairScorer,
    groups: Sequence[RankingGroup],
    dev: Sequence[RankingGroup] | None = None,
    *,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> FitReport:
    """Train a pair scorer on ranking groups; with `dev`, keep the epoch with the best rerank accuracy on it.

    The package's scorers go to their trainers (`fit_cnn`, `fit_cross_encoder`); a scorer from elsewhere trains
    itself with its own `fit(groups, dev, *, seed, log)` method.
    """
    if isinstance(scorer, CNNRanker):
        return fit_cnn(scorer, groups, dev, seed=seed, log=log)
    if isinstance(scorer, CrossEncoderRanker):
        return fit_cross_encoder(scorer, groups, dev, seed=seed, log=log)
    if not callable(getattr(scorer, "fit", None)):
        raise ConceptNormError(Errors.E723.format(scorer=type(scorer).__name__))
    return scorer.fit(groups, dev, seed=seed, log=log)


def fit_ranker(
    ranker: Ranker,
    sets: Sequence[CandidateSet],
    gold: Sequence[set[str]],
    mentions: Sequence[str],
    contexts: Sequence[str],
) -> dict:
    """Fit the ranker's listwise model on the candidate sets it will see (with the fast path on, not those of known
    names) whose gold concept is among the candidates (the others teach nothing about ranking). Its pair scorers'
    columns are read as they are: fit them first.

    gold (Sequence[Set[str]]): Per set, the right concept ids.
    RETURNS (dict): {"sets": sets fitted on, "pairs": candidates, "coef": per column, its weight}.
    """
    keep = [
        i for i, s in enumerate(sets)
        if gold[i] & set(s.concept_ids) and len(s.concept_ids) > 1 and not (ranker.fast_path and s.exact)
    ]  # fmt: skip
    if not keep:
        raise ConceptNormError(Errors.E312)
    mats = ranker.matrix([sets[i] for i in keep], [mentions[i] for i in keep], [contexts[i] for i in keep])
    right = [np.array([c in gold[i] for c in sets[i].concept_ids]) for i in keep]
    x = np.vstack(mats).astype(np.float64)  # float64 weights: saved and reloaded exactly
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    coef = fit_conditional_logit([(m - mean) / scale for m in mats], right, ranker.regularization)
    # no intercept: a constant added to every candidate's score leaves the softmax unchanged
    ranker.weights = {"mean": mean, "scale": scale, "coef": coef}
    return {"sets": len(keep), "pairs": len(x), "coef": dict(zip(ranker.columns, map(float, coef)))}


def fit_conditional_logit(mats: Sequence[np.ndarray], right: Sequence[np.ndarray], l2: float) -> np.ndarray:
    """Weights w maximizing the mean log-probability of the right candidates under a softmax of X @ w over each
    set (McFadden's conditional logit, ListNet with one right answer), with an L2 penalty; L-BFGS in torch.

    mats (Sequence[np.ndarray]): Per set, its (candidates x columns) standardized matrix.
    right (Sequence[np.ndarray]): Per set, a boolean mask of the right candidates (one or more).
    l2 (float): Strength of the penalty on the weights.
    """
    width = max(len(m) for m in mats)
    dim = mats[0].shape[1]
    x = torch.zeros(len(mats), width, dim, dtype=torch.float64)
    valid = torch.zeros(len(mats), width, dtype=torch.bool)
    target = torch.zeros(len(mats), width, dtype=torch.bool)
    for i, (m, r) in enumerate(zip(mats, right)):
        x[i, : len(m)] = torch.from_numpy(np.asarray(m, dtype=np.float64))
        valid[i, : len(m)] = True
        target[i, : len(m)] = torch.from_numpy(r)
    w = torch.zeros(dim, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logp = torch.log_softmax((x @ w).masked_fill(~valid, float("-inf")), dim=1)
        right_logp = torch.logsumexp(logp.masked_fill(~target, float("-inf")), dim=1)
        loss = -right_logp.mean() + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach().numpy().copy()
