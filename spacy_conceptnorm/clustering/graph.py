"""The neighbour graph of CODER++ section 3.1: each term's top-m neighbours by cosine, searched once.

A pair (i, j) is *predicted clustered* at threshold θ when j is among the top-m neighbours of i (or i among
those of j) and cos(i, j) >= θ; clusters are the connected components of those pairs. The pairs are kept once
each, unordered, sorted by score from high to low, so any θ is a prefix of them: one search serves a whole sweep.

Each term's own row is left out of its neighbours, so a term has m *other* neighbours (the paper counts the term
itself in its top-m; the difference is one neighbour). Search: `exact` (one matrix product per batch of queries,
see `search.index.VectorIndex`) while n is at most `EXACT_MAX_TERMS`; beyond that `ivf`, since exact search costs n^2
dot products and its vectors may not fit in memory. IVF has 4 sqrt(n) lists (FAISS's advice: 4 to 16 sqrt(n)),
k-means trained on a random sample of 40 vectors per list; a query visits `nprobe` lists, so it scans about
nprobe * sqrt(n) / 4 vectors and misses neighbours that fall in lists it does not visit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ..errors import ConceptNormError, Errors
from ..search.index import VectorIndex

EXACT_MAX_TERMS = 200_000  # 200k^2 dot products: minutes on 2 cores; more goes to IVF
EXACT_MAX_BYTES = 4 * 2**30  # vectors larger than this go to IVF whatever n is
IVF_LISTS_PER_SQRT_N = 4
IVF_TRAIN_PER_LIST = 40  # k-means training sample per inverted list (FAISS warns under 39)
QUERY_BATCH = 8192  # queries per search call: bounds the (batch x top-m) result arrays
ENCODE_BATCH = 8192  # texts per encoder call: the encoder's own batches are smaller, sorted by length


def check_top_m(top_m: object) -> int:
    if not isinstance(top_m, (int, np.integer)) or isinstance(top_m, bool) or top_m < 1:
        raise ConceptNormError(Errors.E951.format(value=top_m))
    return int(top_m)


def check_threshold(threshold: object, name: str = "threshold") -> float:
    ok = isinstance(threshold, (int, float, np.floating)) and not isinstance(threshold, bool)
    if not ok or not -1.0 <= float(threshold) <= 1.0:  # also rejects NaN
        raise ConceptNormError(Errors.E950.format(name=name, value=threshold))
    return float(threshold)


def encode_terms(encoder, texts: Sequence[str], batch_size: int = ENCODE_BATCH, progress: bool = False) -> np.ndarray:
    """Unit vectors of `texts` (float32, one row each), encoded `batch_size` texts at a time into one array.

    encoder: Any object with `encode(texts) -> array` of unit rows (a NameEncoder, or a stand-in in tests).
    """
    vectors = None
    steps = range(0, len(texts), batch_size)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="Encoding terms", unit="batch")
    for start in steps:
        chunk = np.asarray(encoder.encode(list(texts[start : start + batch_size])), dtype=np.float32)
        if vectors is None:
            vectors = np.empty((len(texts), chunk.shape[1]), dtype=np.float32)
        vectors[start : start + len(chunk)] = chunk
    return vectors if vectors is not None else np.zeros((0, 1), dtype=np.float32)


def pick_index(n: int, dim: int, index_type: str = "auto") -> str:
    if index_type != "auto":
        return index_type
    return "exact" if n <= EXACT_MAX_TERMS and n * dim * 4 <= EXACT_MAX_BYTES else "ivf"


def build_index(vectors: np.ndarray, index_type: str, nprobe: int = 16, nlist: int = 0, seed: int = 0) -> VectorIndex:
    """An index over `vectors` (ids = row numbers). IVF: `nlist` lists (0: 4 sqrt(n)), trained on a random
    sample added first (`VectorIndex` trains on the first vectors it is given)."""
    n, dim = vectors.shape
    if index_type != "ivf":
        index = VectorIndex(dim, index_type=index_type)
        index.add(np.arange(n), vectors)
        return index
    nlist = max(1, min(nlist or int(IVF_LISTS_PER_SQRT_N * math.sqrt(n)), n // IVF_TRAIN_PER_LIST))
    index = VectorIndex(dim, index_type="ivf", ivf_nlist=nlist, ivf_nprobe=nprobe)
    sample = np.sort(np.random.default_rng(seed).choice(n, min(n, nlist * IVF_TRAIN_PER_LIST), replace=False))
    index.add(sample, vectors[sample])
    rest = np.setdiff1d(np.arange(n), sample)
    for start in range(0, len(rest), QUERY_BATCH * 8):
        ids = rest[start : start + QUERY_BATCH * 8]
        index.add(ids, vectors[ids])
    return index


@dataclass
class NeighbourGraph:
    """The predicted pairs of n terms: row < col, one entry per unordered pair, scores from high to low.

    n (int): Number of terms.
    rows (np.ndarray): First term of each pair (int64).
    cols (np.ndarray): Second term of each pair (int64).
    scores (np.ndarray): Their cosine (float32), non-increasing.
    top_m (int): Neighbours searched per term.
    index_type (str): The index that found them.
    """

    n: int
    rows: np.ndarray
    cols: np.ndarray
    scores: np.ndarray
    top_m: int
    index_type: str

    def count_above(self, threshold: float) -> int:
        """How many pairs have a cosine >= `threshold` (they are the first ones)."""
        return int(np.searchsorted(-self.scores, -np.float32(threshold), side="right"))

    def pairs(self, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) of the pairs predicted clustered at `threshold`."""
        k = self.count_above(check_threshold(threshold))
        return self.rows[:k], self.cols[:k]

    def clusters(self, threshold: float) -> np.ndarray:
        """Cluster id per term at `threshold`: the connected components of its pairs, numbered in the order of
        their first term (a term with no pair is a cluster of its own)."""
        return connected_clusters(self.n, *self.pairs(threshold))


def connected_clusters(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Connected-component id per node of an undirected graph given by its edges (scipy's csgraph)."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    graph = coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1].astype(np.int64)


def neighbour_graph(
    vectors: np.ndarray,
    top_m: int = 50,
    min_score: float = -1.0,
    index_type: str = "auto",
    nprobe: int = 16,
    progress: bool = False,
    nlist: int = 0,
) -> NeighbourGraph:
    """Search the top-m neighbours of every vector among all of them and keep the pairs scoring >= `min_score`.

    vectors (np.ndarray): Unit vectors, one row per term (inner product = cosine).
    top_m (int): Neighbours per term, itself excluded.
    min_score (float): Pairs under this cosine are dropped at once (the lowest threshold you will ask for).
    index_type (str): "auto", "exact", "flat", "hnsw" or "ivf" (see `search.index.VectorIndex`).
    nprobe (int): IVF lists visited per query.
    nlist (int): IVF lists; 0 for 4 sqrt(n).
    RETURNS (NeighbourGraph): The pairs, each unordered pair once with its highest score found.
    """
    top_m, min_score = check_top_m(top_m), check_threshold(min_score, "min_score")
    n = len(vectors)
    chosen = pick_index(n, vectors.shape[1] if vectors.ndim == 2 else 0, index_type)
    if n < 2:
        empty = np.zeros(0, dtype=np.int64)
        return NeighbourGraph(n, empty, empty, np.zeros(0, dtype=np.float32), top_m, chosen)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = build_index(vectors, chosen, nprobe, nlist)
    k = min(top_m + 1, n)  # +1: the term itself usually comes first
    keys, scores = [], []
    steps = range(0, n, QUERY_BATCH)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="Searching neighbours", unit="batch")
    for start in steps:
        found_scores, found_ids = index.search(vectors[start : start + QUERY_BATCH], k)
        own = np.arange(start, start + len(found_ids))[:, None]
        valid = (found_ids >= 0) & (found_ids != own)
        valid &= np.cumsum(valid, axis=1) <= top_m  # the first m others (self may be missing among equal vectors)
        valid &= found_scores >= np.float32(min_score)
        i = np.broadcast_to(own, found_ids.shape)[valid]
        j = found_ids[valid]
        keys.append(np.minimum(i, j) * n + np.maximum(i, j))
        scores.append(found_scores[valid].astype(np.float32))
    keys, scores = np.concatenate(keys), np.concatenate(scores)
    order = np.lexsort((-scores, keys))  # by pair, its best score first
    keys, scores = keys[order], scores[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    keys, scores = keys[first], scores[first]
    order = np.argsort(-scores, kind="stable")
    keys, scores = keys[order], scores[order]
    return NeighbourGraph(n, keys // n, keys % n, scores, top_m, chosen)
