"""Pair scorers: learned models that score (mention, candidate name) pairs for the second-stage ranker.

A pair scorer adds one feature column to the ranker (see `linking.ranker`): Mondal et al.'s triplet CNN
(`linking.cnn_ranker`) and a cross-encoder (`linking.cross_encoder`). Both are trained from `RankingGroup`s: a
mention, the names of its candidate concepts (from candidate generation, so the negatives are hard ones) and which
of them are right. This module holds what inference needs; training lives in the training package
(`training.ranker_fit.fit_pair_scorer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


class PairScorer:
    """Scores (mention, candidate name) pairs; higher means more likely the same concept.

    Subclasses implement `score`, `to_disk` and `from_disk`. `score` must be deterministic and must not depend on
    how queries are batched. Training is not part of the protocol (linking never imports training):
    `training.ranker_fit.fit_pair_scorer` trains the package's scorers, and a scorer from elsewhere by calling its
    own `fit(groups, dev, *, seed, log)` method.
    """

    name = "pair_scorer"

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
