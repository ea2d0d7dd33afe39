"""Candidate generation for the second-stage ranker, and the features of each (mention, concept) candidate.

Candidates of a mention are the sieve's top-k concepts (dense search, `SieveSearcher`) together with the
concepts of the names nearest to it lexically (`LexicalIndex`: char n-gram TF-IDF top-k and token Jaccard
top-k, Mondal et al.'s candidate generation). Each candidate concept is described by `FEATURES`, computed over
all of the concept's names, so a concept found lexically also gets its dense score and vice versa.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..kb import DOMAIN, ONTOLOGY, SOURCE_BITS
from ..search import Match, SieveSearcher
from .lexical import LexicalIndex, row_top, row_values

DOMAIN_BIT, ONTOLOGY_BIT = SOURCE_BITS[DOMAIN], SOURCE_BITS[ONTOLOGY]

FEATURES = (
    "dense",  # best cosine between the mention and any name of the concept
    "dense_domain",  # best cosine to the concept's domain names (annotated mentions, user synonyms); 0 if none
    "tfidf",  # best char n-gram TF-IDF cosine to any name of the concept
    "jaccard",  # best token Jaccard to any name of the concept
    "name_coverage",  # best share of a name's tokens found in the mention
    "mention_coverage",  # best share of the mention's tokens found in a name
    "exact",  # the mention's normalized text is a name of the concept
    "sieve_score",  # the score the sieve gave the concept (0 when the sieve did not return it)
    "sieve_rank",  # its rank in the sieve's answer, 0 = first (k when absent)
    "dense_gap",  # best dense score among the candidates minus this one's
    "tfidf_gap",  # the same for TF-IDF
    "prior",  # log(1 + the concept's distinct domain names)
    "count_prior",  # log(1 + the concept's annotated training mentions): how often annotators chose it
    "domain_stage",  # the sieve answered from the domain names (its first stage)
    "tokens",  # the mention's token count
)


@dataclass
class CandidateSet:
    """One query's candidates.

    key (str): The normalized query text.
    concept_ids (List[str]): Candidate concepts; the sieve's order first, then lexical finds.
    names (List[str]): Per candidate, its name nearest to the query (dense), as the ontology writes it.
    features (np.ndarray): (len(concept_ids), len(FEATURES)) float32.
    sieve (Match): The sieve's answer for the query.
    """

    key: str
    concept_ids: list[str]
    names: list[str]
    features: np.ndarray
    sieve: Match

    @property
    def exact(self) -> bool:
        """The query is a known name of one of the candidates (the ranker's fast path)."""
        return bool(len(self.features)) and bool(self.features[:, FEATURES.index("exact")].any())


class CandidateGenerator:
    """Dense (sieve) plus lexical candidates, with features.

    searcher (SieveSearcher): The built sieve searcher (its KB, vectors and rows).
    lexical_k (int): Names taken from each lexical score (TF-IDF and Jaccard).
    lexical (LexicalIndex): A fitted lexical index over the searcher's rows, or None to fit one in `build`.
    """

    def __init__(self, searcher: SieveSearcher, lexical_k: int = 10, lexical: LexicalIndex | None = None) -> None:
        self.searcher = searcher
        self.lexical_k = lexical_k
        self.lexical = lexical
        self.indexed: np.ndarray | None = None  # the KB name id of each row the lexical index holds (-1: free)
        self._concept_rows: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._row_concepts: list[list[str]] | None = None
        self.counts: dict[str, int] = {}  # concept id -> annotated training mentions (the ranker's prior)

    def build(self) -> None:
        """Fit the lexical index on the searcher's names (rows aligned)."""
        self.lexical = LexicalIndex().fit(self.searcher.row_names)
        self.indexed = self.searcher.row_name_ids.copy()
        self.changed()

    def sync(self) -> None:
        """Follow the searcher's rows since the lexical index was built or synced (`add_synonyms` and
        `remove_synonyms`): new rows are added, rows that changed name (freed, or taken by a new name) replaced."""
        # Rows compared by name id, not name: listing MEDIC's 74k row names twice took 0.64 s of every load.
        names, ids = self.searcher.row_names, self.searcher.row_name_ids
        if self.indexed is None:  # loaded: the saved lexical index was in step with the saved rows
            self.indexed = ids[: len(self.lexical)].copy()
        common = min(len(self.indexed), len(ids))
        changed = np.flatnonzero(self.indexed[:common] != ids[:common]).tolist()
        self.lexical.replace(changed, [names[i] for i in changed])
        if len(ids) > len(self.indexed):
            self.lexical.add(names[len(self.indexed) :])
        self.indexed = ids.copy()
        self.changed()

    def changed(self) -> None:
        self._concept_rows = None
        self._row_concepts = None

    def _maps(self) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[list[str]]]:
        """Per concept its name rows and each row's source bits; per row its concepts."""
        if self._concept_rows is None:
            kb, rows = self.searcher.kb, self.searcher.rows
            by_concept: dict[str, list[tuple[int, int]]] = {}
            row_concepts: list[list[str]] = [[] for _ in self.searcher.row_names]
            for name, row in rows.items():
                for cid, bits in kb.name_links(name).items():
                    by_concept.setdefault(cid, []).append((row, bits))
                    row_concepts[row].append(cid)
            self._concept_rows = {
                cid: (np.array([r for r, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int8))
                for cid, pairs in by_concept.items()
            }
            self._row_concepts = row_concepts
        return self._concept_rows, self._row_concepts

    def generate(
        self, keys: Sequence[str], matches: Sequence[Match], vectors: np.ndarray, chunk: int = 64
    ) -> list[CandidateSet]:
        """Candidates and features for normalized queries, the sieve's matches for them and their vectors."""
        out: list[CandidateSet] = []
        for start in range(0, len(keys), chunk):
            end = start + chunk
            out.extend(self._generate(keys[start:end], matches[start:end], vectors[start:end]))
        return out

    def _generate(self, keys: Sequence[str], matches: Sequence[Match], vectors: np.ndarray) -> list[CandidateSet]:
        concept_rows, row_concepts = self._maps()
        hidden = self.searcher.hidden
        lexical = self.lexical.scores(list(keys))
        k = self.lexical_k
        out = []
        for q, (key, match) in enumerate(zip(keys, matches)):
            order = list(dict.fromkeys(c for c, _ in match.candidates))
            for name in ("tfidf", "jaccard"):
                for row in row_top(lexical[name], q, k):
                    order.extend(c for c in row_concepts[row] if c not in hidden)
            order = list(dict.fromkeys(order))
            out.append(self._features(key, match, order, vectors[q], lexical, q, concept_rows))
        return out

    def _features(self, key, match, order, vector, lexical, q, concept_rows) -> CandidateSet:
        """The feature matrix of one query's candidates: per concept, maxima over its names' rows, gathered for
        all candidates at once (one product, one `reduceat` per score; a loop per candidate measured 3x slower)."""
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int8))
        parts = [concept_rows.get(cid, empty) for cid in order]
        sizes = np.array([len(rows) for rows, _ in parts])
        feats = np.zeros((len(order), len(FEATURES)), dtype=np.float32)
        if not len(order):
            return CandidateSet(key, order, [], feats, match)
        rows = np.concatenate([r for r, _ in parts])
        bits = np.concatenate([b for _, b in parts])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        has = sizes > 0
        safe = np.minimum(starts, max(len(rows) - 1, 0))

        def best(values: np.ndarray) -> np.ndarray:
            if not len(values):
                return np.zeros(len(order), np.float32)
            return np.where(has, np.maximum.reduceat(values, safe), 0.0)

        col = {name: i for i, name in enumerate(FEATURES)}
        dense = self.searcher.vectors[rows] @ vector
        domain = (bits & DOMAIN_BIT) > 0
        feats[:, col["dense"]] = best(dense)
        feats[:, col["dense_domain"]] = np.maximum(best(np.where(domain, dense, -1.0)), 0.0)
        for name in ("tfidf", "jaccard", "name_coverage", "mention_coverage"):
            feats[:, col[name]] = best(row_values(lexical[name], q, rows))
        exact = set(self.searcher.kb.concepts_for(key))
        feats[:, col["exact"]] = [cid in exact for cid in order]
        sieve_scores = dict(match.candidates)
        sieve_rank = {c: i for i, (c, _) in enumerate(match.candidates)}
        feats[:, col["sieve_score"]] = [sieve_scores.get(c, 0.0) for c in order]
        feats[:, col["sieve_rank"]] = [sieve_rank.get(c, len(match.candidates)) for c in order]
        feats[:, col["dense_gap"]] = feats[:, col["dense"]].max() - feats[:, col["dense"]]
        feats[:, col["tfidf_gap"]] = feats[:, col["tfidf"]].max() - feats[:, col["tfidf"]]
        feats[:, col["prior"]] = np.log1p(np.add.reduceat(domain.astype(np.float32), safe) * has) if len(rows) else 0
        feats[:, col["count_prior"]] = np.log1p([self.counts.get(c, 0) for c in order])
        feats[:, col["domain_stage"]] = float(match.stage is not None and match.stage.startswith("D-"))
        feats[:, col["tokens"]] = float(len(key.split()))
        # each candidate's name nearest to the query (dense): the text pair scorers compare
        nearest = [int(np.argmax(dense[s : s + n])) if n else -1 for s, n in zip(starts, sizes)]
        row_names = self.searcher.row_names
        surface = self.searcher.kb.surface
        names = [surface(row_names[rows[s + j]]) if j >= 0 else "" for s, j in zip(starts, nearest)]
        return CandidateSet(key, order, names, feats, match)
