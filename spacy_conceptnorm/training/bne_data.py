"""BNE's training data: the mini-batches of (name, synonym, concept) triples drawn from a knowledge base's synonym
sets (`kb.synonyms`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import ConceptNormError, Errors


@dataclass
class TripleBatch:
    """A mini-batch: anchors s, a synonym s' of each, their concept c.

    anchors (List[str]): The names s.
    positives (List[str]): A synonym s' of each anchor (the anchor itself when its concept has one name).
    has_synonym (np.ndarray): (batch,) bool, False where s' is s (no synonym term for that anchor).
    names (np.ndarray): (batch,) index of each anchor in `SynonymData.names`.
    concepts (np.ndarray): (batch,) index of each anchor's concept in `SynonymData.concepts`.
    """

    anchors: list[str]
    positives: list[str]
    has_synonym: np.ndarray
    names: np.ndarray
    concepts: np.ndarray


class SynonymData:
    """The (name, concept) pairs of the synonym sets, served in shuffled mini-batches.

    sets (Dict[str, List[str]]): Concept id -> names, from `synonym_sets`.
    seed (int): Seeds the shuffling and the synonym draws.
    """

    def __init__(self, sets: dict[str, list[str]], seed: int = 0) -> None:
        self.concepts = sorted(sets)
        if not any(len(sets[c]) > 1 for c in self.concepts):
            raise ConceptNormError(Errors.E962.format(what="the knowledge base"))
        self.names = sorted({n for names in sets.values() for n in names})
        name_index = {n: i for i, n in enumerate(self.names)}
        self.members = [np.array([name_index[n] for n in sets[c]], dtype=np.int64) for c in self.concepts]
        self.pairs = np.array([(i, c) for c, m in enumerate(self.members) for i in m], dtype=np.int64)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.pairs)

    def batches(self, batch_size: int, limit: int | None = None) -> Iterator[TripleBatch]:
        """One epoch: every (name, concept) pair once as an anchor, in shuffled order; at most `limit` pairs."""
        order = self.rng.permutation(len(self.pairs))[:limit]
        for start in range(0, len(order), batch_size):
            pairs = self.pairs[order[start : start + batch_size]]
            positives, has_synonym = [], []
            for name, concept in pairs:
                others = self.members[concept][self.members[concept] != name]
                has_synonym.append(len(others) > 0)
                positives.append(self.names[self.rng.choice(others)] if len(others) else self.names[name])
            yield TripleBatch(
                [self.names[i] for i in pairs[:, 0]], positives, np.array(has_synonym), pairs[:, 0], pairs[:, 1]
            )
