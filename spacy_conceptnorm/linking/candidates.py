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

from ..kb.knowledge_base import DOMAIN, ONTOLOGY, SOURCE_BITS
from ..search.sieve import Match, SieveSearcher
from .lexical import LexicalIndex, row_top, row_values

DOMAIN_BIT, ONTOLOGY_BIT = SOURCE_BITS[DOMAIN], SOURCE_BITS[ONTOLOGY]
# The ranker's candidate settings: on NCBI-disease dev, more dense candidates or (2, 3)-grams found no better
# answers and cost speed (docs/benchmarks.md)
DENSE_K, NGRAM_RANGE = 10, (3, 3)

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
    ngram_range (Tuple[int, int]): Character n-gram sizes of the TF-IDF index `build` fits.
    """

    def __init__(
        self,
        searcher: SieveSearcher,
        lexical_k: int = 10,
        lexical: LexicalIndex | None = None,
        ngram_range: tuple[int, int] = NGRAM_RANGE,
    ) -> None:
        self.searcher = searcher
        self.lexical_k = lexical_k
        self.lexical = lexical
        self.ngram_range = tuple(ngram_range)
        self.indexed: np.ndarray | None = None  # the KB name id of each row the lexical index holds (-1: free)
        self._concept_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see `_rows_by_concept`
        self.counts: dict[str, int] = {}  # concept id -> annotated training mentions (the ranker's prior)

    def build(self) -> None:
        """Fit the lexical index on the searcher's names (rows aligned)."""
        self.lexical = LexicalIndex(self.ngram_range).fit(self.searcher.row_names)
        self.indexed = self.searcher.row_name_ids.copy()
        self.changed()

    def sync(self) -> None:
        """Follow the searcher's rows since the lexical index was built or synced (`add_synonyms` and
        `remove_synonyms`): new rows are added, rows that changed name (freed, or taken by a new name) replaced."""
        # Rows compared by name id, not name: listing every row's name twice would add over half a second to a load.
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

    def _rows_by_concept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every concept's name rows: (rows, their link's source bits, starts), concept index i owning
        rows[starts[i]:starts[i + 1]], in row order. Built from the KB's link arrays at once: a dict of concept ->
        rows filled name by name would add most of a second to the first batch after a load."""
        if self._concept_rows is None:
            kb, name_row = self.searcher.kb, self.searcher.name_rows
            owner, target, bits = kb.links()
            known = owner < len(name_row)
            rows = np.where(known, name_row[np.where(known, owner, 0)], -1)
            keep = rows >= 0
            rows, target, bits = rows[keep], target[keep], bits[keep]
            order = np.lexsort((rows, target))
            starts = np.searchsorted(target[order], np.arange(len(kb.concepts) + 1))
            self._concept_rows = (rows[order], bits[order].astype(np.int8), starts)
        return self._concept_rows

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
        concept_rows = self._rows_by_concept()
        searcher = self.searcher
        hidden, row_name_ids, concepts_of = searcher.hidden, searcher.row_name_ids, searcher.kb.concepts_of
        lexical = self.lexical.scores(list(keys))
        k = self.lexical_k
        out = []
        for q, (key, match) in enumerate(zip(keys, matches)):
            order = list(dict.fromkeys(c for c, _ in match.candidates))
            for name in ("tfidf", "jaccard"):
                for row in row_top(lexical[name], q, k):
                    name_id = int(row_name_ids[row])
                    if name_id >= 0:  # a free row scores 0 and is never found, but concepts_of(-1) would read a list
                        order.extend(c for c in concepts_of(name_id) if c not in hidden)
            order = list(dict.fromkeys(order))
            out.append(self._features(key, match, order, vectors[q], lexical, q, concept_rows))
        return out

    def _features(self, key, match, order, vector, lexical, q, concept_rows) -> CandidateSet:
        """The feature matrix of one query's candidates: per concept, maxima over its names' rows, gathered for
        all candidates at once (one product, one `reduceat` per score; a loop per candidate measured 3x slower)."""
        feats = np.zeros((len(order), len(FEATURES)), dtype=np.float32)
        if not len(order):
            return CandidateSet(key, order, [], feats, match)
        all_rows, all_bits, concept_starts = concept_rows
        index = np.array([self.searcher.kb.concepts.index(cid) for cid in order])
        found = index >= 0
        lo = np.where(found, concept_starts[index], 0)
        sizes = np.where(found, concept_starts[np.where(found, index + 1, 0)], 0) - lo
        rows = np.concatenate([all_rows[a : a + n] for a, n in zip(lo, sizes)])
        bits = np.concatenate([all_bits[a : a + n] for a, n in zip(lo, sizes)])
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
