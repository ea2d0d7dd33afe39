"""BNE's evaluations (Phan et al. 2019, section 4), over any encoder's unit vectors.

- `synonym_closeness`: mean coverage at k (section 4.1: the share of a name's synonyms found among its k nearest
  names) and MAP of the full ranking, over a pool of names (the held-out concepts' names);
- `synonym_retrieval_map`: section 4.2's MAP, with queries (corpus mentions), BM25 retrieving the top-20
  concepts, all their names ranked by cosine, AP against the gold concept's names (0 when BM25 missed it);
- `nearest_name_accuracy`: Acc@1 of the concept of the nearest name (section 4.3 without the text processing).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..io.corpus import read_pubtator
from ..kb.knowledge_base import KnowledgeBase
from ..kb.synonyms import synonym_sets

COVERAGE_KS = (1, 4, 16, 64, 256, 1024)  # the paper's Figure 4


def gold_mentions(kb: KnowledgeBase, path: str | Path) -> list[tuple[str, str]]:
    """(mention text, concept id) of a PubTator file, the id resolved in the KB; composite mentions (several ids)
    and ids not in the KB are left out."""
    out = []
    for doc in read_pubtator(path):
        for ann in doc.annotations:
            ids = ann.id.replace("+", "|").split("|")
            resolved = kb.resolve(ids[0]) if len(ids) == 1 else None
            if resolved is not None:
                out.append((ann.text, resolved))
    return out


def _relevance(labels: Sequence[frozenset[str]], rows: np.ndarray) -> np.ndarray:
    """(len(rows), n) bool: whether names `rows` and each name share a concept."""
    concepts = {c: i for i, c in enumerate(sorted({c for ls in labels for c in ls}))}
    pairs = [(i, concepts[c]) for i, ls in enumerate(labels) for c in ls]
    r, c = zip(*pairs)
    incidence = sp.csr_matrix((np.ones(len(r), dtype=np.float32), (r, c)), shape=(len(labels), len(concepts)))
    return (incidence[rows] @ incidence.T).toarray() > 0


def average_precision(relevant_sorted: np.ndarray, n_relevant: np.ndarray) -> np.ndarray:
    """AP per row of a ranking given as a bool matrix (row: relevance of each rank), over `n_relevant` items."""
    hits = np.cumsum(relevant_sorted, axis=1)
    ranks = np.arange(1, relevant_sorted.shape[1] + 1)
    precision_sum = np.where(relevant_sorted, hits / ranks, 0.0).sum(axis=1)
    return np.divide(precision_sum, n_relevant, out=np.zeros(len(n_relevant)), where=n_relevant > 0)


def synonym_closeness(
    vectors: np.ndarray, labels: Sequence[frozenset[str]], ks: Sequence[int] = COVERAGE_KS, block: int = 512
) -> dict[str, float]:
    """Mean coverage@k and MAP over a pool of names: every name with a synonym in the pool queries all the others.

    vectors (np.ndarray): (names, dim) unit vectors of the pool.
    labels (Sequence[FrozenSet[str]]): The concept ids of each name.
    ks (Sequence[int]): The k of coverage@k.
    RETURNS (Dict[str, float]): "map", "coverage@k" per k, and "queries".
    """
    n = len(labels)
    coverage = {k: [] for k in ks}
    aps = []
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        relevant = _relevance(labels, rows)
        relevant[np.arange(len(rows)), rows] = False  # a name is not its own synonym
        sims = vectors[rows] @ vectors.T
        sims[np.arange(len(rows)), rows] = -np.inf  # nor its own neighbour
        order = np.argsort(-sims, axis=1, kind="stable")[:, : n - 1]
        ranked = np.take_along_axis(relevant, order, axis=1)
        n_relevant = relevant.sum(axis=1)
        queries = n_relevant > 0
        aps.extend(average_precision(ranked[queries], n_relevant[queries]))
        for k in ks:
            coverage[k].extend(ranked[queries, :k].sum(axis=1) / n_relevant[queries])
    return {"map": float(np.mean(aps)), **{f"coverage@{k}": float(np.mean(v)) for k, v in coverage.items()},
            "queries": len(aps)}  # fmt: skip


class BM25:
    """Okapi BM25 over the words of KB names (k1 = 1.2, b = 0.75), to retrieve candidate concepts.

    kb (KnowledgeBase): Its ontology names are the documents; a concept scores its best name.
    """

    def __init__(self, kb: KnowledgeBase, k1: float = 1.2, b: float = 0.75) -> None:
        self.kb = kb
        self.sets = synonym_sets(kb)
        self.names = sorted({n for names in self.sets.values() for n in names})
        self.name_row = {n: i for i, n in enumerate(self.names)}
        self.vocab: dict[str, int] = {}
        rows, cols = [], []
        for i, name in enumerate(self.names):
            for word in name.split():
                rows.append(i)
                cols.append(self.vocab.setdefault(word, len(self.vocab)))
        tf = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(self.names), len(self.vocab)))
        tf.sum_duplicates()
        df = np.bincount(tf.indices, minlength=len(self.vocab))
        idf = np.log(1 + (len(self.names) - df + 0.5) / (df + 0.5))
        length = np.asarray(tf.sum(axis=1)).ravel()
        norm = k1 * (1 - b + b * length / length.mean())
        tf = tf.tocoo()
        weights = tf.data * (k1 + 1) / (tf.data + norm[tf.row]) * idf[tf.col]
        self.weights = sp.csc_matrix((weights, (tf.row, tf.col)), shape=tf.shape)
        concept_ids = sorted(self.sets)
        self.concept_ids = concept_ids
        name_concepts = [(self.name_row[n], c) for c, cid in enumerate(concept_ids) for n in self.sets[cid]]
        self.name_concepts = np.array(name_concepts, dtype=np.int64)

    def top_concepts(self, query: str, k: int = 20) -> list[str]:
        """The `k` concepts whose best name scores highest for the (normalized) query; ties by concept id."""
        cols = [self.vocab[w] for w in dict.fromkeys(self.kb.normalizer(query).split()) if w in self.vocab]
        if not cols:
            return []
        name_scores = np.asarray(self.weights[:, cols].sum(axis=1)).ravel()
        concept_scores = np.zeros(len(self.concept_ids))
        np.maximum.at(concept_scores, self.name_concepts[:, 1], name_scores[self.name_concepts[:, 0]])
        top = np.lexsort((np.arange(len(concept_scores)), -concept_scores))[:k]
        return [self.concept_ids[i] for i in top if concept_scores[i] > 0]


def synonym_retrieval_map(
    query_vectors: np.ndarray,
    gold: Sequence[str],
    candidates: Sequence[Sequence[str]],
    name_vectors: np.ndarray,
    bm25: BM25,
) -> float:
    """Section 4.2's MAP: each query ranks the names of its BM25 candidate concepts by cosine; AP counts the names
    of its gold concept (0 when BM25 did not retrieve it).

    query_vectors (np.ndarray): (queries, dim) unit vectors.
    gold (Sequence[str]): The gold concept id of each query.
    candidates (Sequence[Sequence[str]]): The BM25 top concepts of each query.
    name_vectors (np.ndarray): Unit vectors of `bm25.names`, row for row.
    bm25 (BM25): Gives the names of each concept.
    """
    aps = []
    for vector, gold_id, concepts in zip(query_vectors, gold, candidates):
        if gold_id not in concepts:
            aps.append(0.0)
            continue
        names = sorted({bm25.name_row[n] for c in concepts for n in bm25.sets[c]})
        relevant_rows = {bm25.name_row[n] for n in bm25.sets[gold_id]}
        order = np.argsort(-(name_vectors[names] @ vector), kind="stable")
        ranked = np.array([[names[i] in relevant_rows for i in order]])
        aps.append(float(average_precision(ranked, np.array([len(relevant_rows)]))[0]))
    return float(np.mean(aps)) if aps else 0.0


def nearest_name_accuracy(
    query_vectors: np.ndarray, gold: Sequence[str], name_vectors: np.ndarray, names: Sequence[str], kb: KnowledgeBase
) -> float:
    """Acc@1 when each query takes a concept of its nearest name (the first listed for a shared name)."""
    if not len(gold):
        return 0.0
    hits = 0
    for start in range(0, len(gold), 1024):
        nearest = np.argmax(query_vectors[start : start + 1024] @ name_vectors.T, axis=1)
        for row, gold_id in zip(nearest, gold[start : start + 1024]):
            concepts = kb.concepts_for(names[row])
            hits += bool(concepts) and concepts[0] == gold_id
    return hits / len(gold)
