"""What training a pair scorer reports, and the dev figure that picks its best epoch.

The pair scorers' trainers (`cnn_fit`, `cross_encoder_fit`) train on `RankingGroup`s and, given dev groups, keep
the epoch with the best `rerank_accuracy` on them; each returns a `FitReport`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..linking.pair_scorer import PairScorer, RankingGroup


@dataclass
class FitReport:
    """What a fit did. seconds (float): wall time; epochs (int); history (List[dict]): per epoch, e.g. loss and
    dev rerank accuracy."""

    seconds: float
    epochs: int
    history: list[dict] = field(default_factory=list)


def rerank_accuracy(scorer: PairScorer, groups: Sequence[RankingGroup]) -> float:
    """Share of groups with a right name whose best-scored name is a right one (ties: the earlier name)."""
    usable = [g for g in groups if any(g.labels)]
    if not usable:
        return 0.0
    scores = scorer.score([g.mention for g in usable], [g.names for g in usable], [g.context for g in usable])
    return sum(g.labels[int(np.argmax(s))] for g, s in zip(usable, scores)) / len(usable)
