"""Lexical search over the knowledge base's names, the sparse half of candidate generation.

Two scores between a mention and every name, both as sparse matrix products (scikit-learn + scipy):
- `tfidf`: cosine of character n-gram TF-IDF vectors (BioSyn's sparse score; n-grams inside word boundaries);
- `jaccard`: |A ∩ B| / |A ∪ B| of the two token sets (Mondal et al.'s candidate generation), from a binary
  token matrix: the intersection is a product, the union |A| + |B| - |A ∩ B|; also the intersection's share of
  the name's tokens and of the mention's. The token vocabulary grows with added names (`add`); the n-gram
  vocabulary and IDF weights stay as fitted.
Rows follow the searcher's name rows, so a row id means the same name in the dense and the lexical index.
Over more than `MAX_NAMES` names the index is off (W106): its TF-IDF matrices and a query batch's dense TF-IDF
scores (batch x names) would take gigabytes, so every lexical score is 0 and the candidates are the sieve's alone.
scikit-learn is imported when the TF-IDF vectorizer is first needed (fitting, or scoring a query), not when a
saved index is loaded: it costs seconds and ~150 MB, and a pipeline whose mentions are known names never needs it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import numpy as np
import srsly
from scipy import sparse

from ..errors import Warnings

TOKEN = re.compile(r"\w+")
MAX_NAMES = 1_000_000  # lexical scores over at most this many names (see the module docstring)
SCORES = ("tfidf", "jaccard", "name_coverage", "mention_coverage")


class LexicalIndex:
    """TF-IDF and Jaccard scores of queries against a fixed list of names.

    ngram_range (Tuple[int, int]): Character n-gram sizes of the TF-IDF vectors.
    max_names (int): Fitted on more names than this, the index is off: every score is 0.
    """

    def __init__(self, ngram_range: tuple[int, int] = (2, 3), max_names: int = MAX_NAMES) -> None:
        self.ngram_range = tuple(ngram_range)
        self.max_names = max_names
        self.off_rows: int | None = None  # the rows of an index that is off (too many names), else None
        self._tfidf = None  # the TF-IDF vectorizer, made on first use
        self._fitted: tuple[dict[str, int], np.ndarray] | None = None  # its vocabulary and IDF, read by from_bytes
        self.vocabulary: dict[str, int] = {}  # token -> column; grows as names are added
        self._tfidf_t: sparse.csr_matrix | None = None  # names' TF-IDF vectors, transposed (V x N)
        self._tokens_t: sparse.csr_matrix | None = None
        self._token_counts = np.zeros(0, dtype=np.float32)

    @property
    def tfidf(self):
        """The character n-gram TfidfVectorizer (scikit-learn is imported here, the first time)."""
        if self._tfidf is None:
            from sklearn.feature_extraction.text import TfidfVectorizer

            tfidf = TfidfVectorizer(
                analyzer="char_wb", ngram_range=self.ngram_range, sublinear_tf=True, dtype=np.float32
            )
            if self._fitted is not None:  # kept: a thread racing this one builds the same vectorizer
                tfidf.vocabulary_, tfidf.idf_ = self._fitted
            self._tfidf = tfidf
        return self._tfidf

    def __len__(self) -> int:
        if self.off_rows is not None:
            return self.off_rows
        return 0 if self._tfidf_t is None else self._tfidf_t.shape[1]

    def fit(self, names: Sequence[str | None]) -> LexicalIndex:
        """Fit the vocabularies on the names and index them; None (a freed row) indexes as an empty name. Over
        `max_names` names, only count them: the index is off."""
        if len(names) > self.max_names:
            warnings.warn(Warnings.W106.format(names=len(names), limit=self.max_names), stacklevel=2)
            self.off_rows = len(names)
            return self
        texts = [n or "" for n in names]
        self._tfidf_t = self.tfidf.fit_transform(texts).T.tocsr()
        self.vocabulary = {}
        tokens = self._token_matrix(texts, grow=True)
        self._tokens_t = tokens.T.tocsr()
        self._token_counts = np.asarray(tokens.sum(axis=1), dtype=np.float32).ravel()
        return self

    def _token_matrix(self, texts: Sequence[str], grow: bool) -> sparse.csr_matrix:
        """Binary (texts x vocabulary) matrix of distinct lower-cased tokens; `grow` adds unseen tokens."""
        rows, cols = [], []
        for i, text in enumerate(texts):
            for token in set(TOKEN.findall(text.lower())):
                j = self.vocabulary.get(token)
                if j is None and grow:
                    j = self.vocabulary[token] = len(self.vocabulary)
                if j is not None:
                    rows.append(i)
                    cols.append(j)
        data = np.ones(len(rows), dtype=np.float32)
        return sparse.csr_matrix((data, (rows, cols)), shape=(len(texts), len(self.vocabulary)))

    def add(self, names: Sequence[str | None]) -> None:
        """Append rows for new names (vocabularies stay as fitted: unseen n-grams and tokens are ignored)."""
        if self.off_rows is not None:
            self.off_rows += len(names)
            return
        texts = [n or "" for n in names]
        self._tfidf_t = sparse.hstack([self._tfidf_t, self.tfidf.transform(texts).T]).tocsr()
        tokens = self._token_matrix(texts, grow=True)
        old = self._tokens_t
        old = sparse.vstack([old, sparse.csr_matrix((tokens.shape[1] - old.shape[0], old.shape[1]))]).tocsr()
        self._tokens_t = sparse.hstack([old, tokens.T]).tocsr()
        self._token_counts = np.concatenate([self._token_counts, np.asarray(tokens.sum(axis=1)).ravel()])

    def replace(self, rows: Sequence[int], names: Sequence[str | None]) -> None:
        """Index other names in existing rows (rows of removed names taken by new ones; None empties a row)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows) or self.off_rows is not None:
            return
        n = len(self)
        keep = np.ones(n, dtype=np.float32)
        keep[rows] = 0
        # (k x n) matrix moving the k new columns to their rows; the old columns there are zeroed
        place = sparse.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), n))
        texts = [name or "" for name in names]
        self._tfidf_t = (self._tfidf_t @ sparse.diags(keep) + self.tfidf.transform(texts).T @ place).tocsr()
        tokens = self._token_matrix(texts, grow=True)
        old = self._tokens_t
        old = sparse.vstack([old, sparse.csr_matrix((tokens.shape[1] - old.shape[0], n))]).tocsr()
        self._tokens_t = (old @ sparse.diags(keep) + tokens.T @ place).tocsr()
        self._tokens_t.eliminate_zeros()
        self._tfidf_t.eliminate_zeros()
        self._token_counts[rows] = np.asarray(tokens.sum(axis=1)).ravel()

    def scores(self, queries: Sequence[str]) -> dict[str, np.ndarray | sparse.csr_matrix]:
        """(len(queries) x len(self)) matrices against every name: "tfidf" (cosine; dense, since character
        n-grams touch most names), and, sparse since they are zero wherever no token is shared, "jaccard" and the
        token overlap's share of the name's tokens ("name_coverage") and of the query's ("mention_coverage").
        Sparse token scores make candidate generation 1.3x faster than dense ones. An index that is off gives empty
        sparse matrices."""
        if self.off_rows is not None:
            return {name: sparse.csr_matrix((len(queries), self.off_rows), dtype=np.float32) for name in SCORES}
        tfidf = (self.tfidf.transform(queries) @ self._tfidf_t).toarray()
        inter = (self._token_matrix(queries, grow=False) @ self._tokens_t).tocsr()
        inter.eliminate_zeros()
        inter.sort_indices()
        # every distinct token of the query counts, known to the names or not
        q_counts = np.array([len(set(TOKEN.findall(q.lower()))) for q in queries], dtype=np.float32)
        shared = inter.data
        query_tokens = np.repeat(q_counts, np.diff(inter.indptr))
        name_tokens = self._token_counts[inter.indices]

        def share(den: np.ndarray) -> sparse.csr_matrix:
            return sparse.csr_matrix((shared / den, inter.indices, inter.indptr), shape=inter.shape)

        return {
            "tfidf": tfidf,
            "jaccard": share(query_tokens + name_tokens - shared),
            "name_coverage": share(name_tokens),
            "mention_coverage": share(query_tokens),
        }

    def to_bytes(self) -> bytes:
        """Vocabularies, IDF weights and matrices as plain arrays (msgpack; nothing is unpickled on load)."""
        if self.off_rows is not None:
            return srsly.msgpack_dumps({"ngram_range": list(self.ngram_range), "off_rows": self.off_rows})
        vocabulary, idf = (self._tfidf.vocabulary_, self._tfidf.idf_) if self._tfidf is not None else self._fitted
        return srsly.msgpack_dumps(
            {
                "ngram_range": list(self.ngram_range),
                "tfidf_vocabulary": {k: int(v) for k, v in vocabulary.items()},
                "idf": np.asarray(idf, dtype=np.float64),
                "token_vocabulary": self.vocabulary,
                "tfidf_t": _csr_parts(self._tfidf_t),
                "tokens_t": _csr_parts(self._tokens_t),
                "token_counts": self._token_counts,
            }
        )

    def from_bytes(self, data: bytes) -> LexicalIndex:
        msg = srsly.msgpack_loads(data)
        self.__init__(tuple(msg["ngram_range"]), self.max_names)
        if "off_rows" in msg:
            self.off_rows = int(msg["off_rows"])
            return self
        self._fitted = (msg["tfidf_vocabulary"], np.asarray(msg["idf"], dtype=np.float64))
        self.vocabulary = {str(k): int(v) for k, v in msg["token_vocabulary"].items()}
        self._tfidf_t = _csr(msg["tfidf_t"])
        self._tokens_t = _csr(msg["tokens_t"])
        self._token_counts = np.array(msg["token_counts"], dtype=np.float32)  # a writable copy
        return self


def row_values(matrix: np.ndarray | sparse.csr_matrix, q: int, columns: np.ndarray) -> np.ndarray:
    """Row `q` of a dense or a (sorted-index) CSR matrix at `columns`, zeros where a sparse row has no entry."""
    if not sparse.issparse(matrix):
        return matrix[q][columns]
    start, end = matrix.indptr[q], matrix.indptr[q + 1]
    indices, data = matrix.indices[start:end], matrix.data[start:end]
    if not len(indices):
        return np.zeros(len(columns), dtype=np.float32)
    pos = np.minimum(np.searchsorted(indices, columns), len(indices) - 1)
    return np.where(indices[pos] == columns, data[pos], 0.0).astype(np.float32)


def row_top(matrix: np.ndarray | sparse.csr_matrix, q: int, k: int) -> np.ndarray:
    """The columns of row `q`'s k highest positive scores, best first (ties: the lower column). On a dense row of
    every name, finding the k-th score first takes a third of the time of filtering the positive scores first."""
    if sparse.issparse(matrix):  # indices sorted: a position order is the column order
        start, end = matrix.indptr[q], matrix.indptr[q + 1]
        columns, values = matrix.indices[start:end], matrix.data[start:end]
    else:
        columns, values = None, matrix[q]
    if len(values) > k:
        kth = -np.partition(-values, k - 1)[k - 1]
        above = np.flatnonzero(values > kth)
        chosen = np.concatenate([above, np.flatnonzero(values == kth)[: k - len(above)]])
    else:
        chosen = np.arange(len(values))
    chosen = chosen[values[chosen] > 0]
    found = chosen if columns is None else columns[chosen]
    return found[np.lexsort((found, -values[chosen]))]


def _csr_parts(matrix: sparse.csr_matrix) -> dict:
    return {"data": matrix.data, "indices": matrix.indices, "indptr": matrix.indptr, "shape": list(matrix.shape)}


def _csr(parts: dict) -> sparse.csr_matrix:
    return sparse.csr_matrix((parts["data"], parts["indices"], parts["indptr"]), shape=tuple(parts["shape"]))
