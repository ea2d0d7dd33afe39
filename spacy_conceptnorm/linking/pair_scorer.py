"""Pair scorers: learned models that score (mention, candidate name) pairs for the second-stage ranker.

A pair scorer adds one feature column to the ranker (see `ranking.ranker`): Mondal et al.'s triplet CNN
(`ranking.cnn`) and a cross-encoder (`ranking.cross_encoder`). Both are trained from `RankingGroup`s: a mention,
the names of its candidate concepts (from candidate generation, so the negatives are hard ones) and which of
them are right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import srsly


@dataclass
class RankingGroup:
    """One training or evaluation query.

    mention (str): The mention text, as written.
    names (List[str]): One name per candidate concept (the candidate's best-matching name), best candidate first.
    labels (List[int]): Per name, 1 when its concept is a right one for the mention, else 0.
    context (str): A short window of text around the mention ("" when none).
    """

    mention: str
    names: list[str]
    labels: list[int]
    context: str = ""

    def to_dict(self) -> dict:
        return {"mention": self.mention, "names": self.names, "labels": self.labels, "context": self.context}


def read_groups(path: str | Path) -> list[RankingGroup]:
    """RankingGroups from a JSONL file with {"mention", "names", "labels", "context"?} per line."""
    return [
        RankingGroup(g["mention"], list(g["names"]), list(g["labels"]), g.get("context", ""))
        for g in srsly.read_jsonl(path)
    ]


def write_groups(path: str | Path, groups: Sequence[RankingGroup]) -> None:
    srsly.write_jsonl(path, (g.to_dict() for g in groups))


def rerank_accuracy(scorer: PairScorer, groups: Sequence[RankingGroup]) -> float:
    """Share of groups with a right name whose best-scored name is a right one (ties: the earlier name)."""
    usable = [g for g in groups if any(g.labels)]
    if not usable:
        return 0.0
    scores = scorer.score([g.mention for g in usable], [g.names for g in usable], [g.context for g in usable])
    return sum(g.labels[int(np.argmax(s))] for g, s in zip(usable, scores)) / len(usable)


@dataclass
class FitReport:
    """What `fit` did. seconds (float): wall time; epochs (int); history (List[dict]): per epoch, e.g. loss and
    dev rerank accuracy."""

    seconds: float
    epochs: int
    history: list[dict] = field(default_factory=list)


class PairScorer:
    """Scores (mention, candidate name) pairs; higher means more likely the same concept.

    Subclasses implement `fit`, `score`, `to_disk` and `from_disk`. `score` must be deterministic and must not
    depend on how queries are batched.
    """

    name = "pair_scorer"

    def fit(
        self,
        groups: Sequence[RankingGroup],
        dev: Sequence[RankingGroup] | None = None,
        *,
        seed: int = 0,
        log: Callable[[str], None] = print,
    ) -> FitReport:
        """Train on the groups (dev, when given, picks the best epoch by `rerank_accuracy`)."""
        raise NotImplementedError

    def score(
        self,
        mentions: Sequence[str],
        names: Sequence[Sequence[str]],
        contexts: Sequence[str] | None = None,
    ) -> list[np.ndarray]:
        """Per mention, one float32 score per candidate name."""
        raise NotImplementedError

    def to_disk(self, path: str | Path) -> None:
        """Write the scorer into directory `path` (created)."""
        raise NotImplementedError

    def from_disk(self, path: str | Path) -> PairScorer:
        """Load what `to_disk` wrote; a missing or corrupt file raises ConceptNormError naming it."""
        raise NotImplementedError
