"""Pairwise precision, recall and F1 of a term clustering against gold concept ids, without enumerating n^2 pairs
(CODER++ section 3.2).

Every unordered pair of the n terms is a TP, FP, FN or TN: positive when the pair is predicted clustered,
true when both terms have the same gold concept. Two readings of "predicted clustered":

- `count_pairs` (the paper's): the pair itself is a predicted neighbour pair (j in the top-m of i, or i in the
  top-m of j, and cosine >= θ). TP and FP come from traversing those pairs, one gold-label comparison each;
  the gold positives are sum_c C(|c|, 2) over the gold clusters' sizes, and every TP is one of them, so
  FN = sum_c C(|c|, 2) - TP. (The paper enumerates each gold cluster's pairs and looks them up among the
  predicted ones; counting through the sizes gives the same number without the look-up.)
- `count_clusters`: both terms are in the same predicted cluster (connected component: transitive). With n_k
  terms in predicted cluster k, n_c in gold cluster c and n_kc in both: TP = sum_kc C(n_kc, 2),
  predicted positives = sum_k C(n_k, 2), gold positives = sum_c C(n_c, 2).

Either way TN = C(n, 2) - TP - FP - FN. Costs: O(n + pairs), and one sort of n labels for the contingency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from spacy.scorer import PRFScore

from ..errors import ConceptNormError, Errors


@dataclass(frozen=True)
class PairCounts:
    """The confusion counts over all C(n, 2) term pairs.

    tp (int): Same gold concept, predicted together.
    fp (int): Different gold concepts, predicted together.
    fn (int): Same gold concept, predicted apart.
    tn (int): Different gold concepts, predicted apart.
    """

    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def prf(self) -> PRFScore:
        return PRFScore(tp=self.tp, fp=self.fp, fn=self.fn)

    @property
    def precision(self) -> float:
        return self.prf.precision

    @property
    def recall(self) -> float:
        return self.prf.recall

    @property
    def f1(self) -> float:
        return self.prf.fscore

    def as_dict(self) -> dict:
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1}


def gold_codes(gold: Sequence, n: int | None = None) -> np.ndarray:
    """Gold labels (any hashable values, e.g. concept ids) as integer codes 0..k-1."""
    if n is not None and len(gold) != n:
        raise ConceptNormError(Errors.E956.format(gold=len(gold), n=n))
    if isinstance(gold, np.ndarray) and gold.dtype.kind in "iu":
        return gold.astype(np.int64)
    return np.unique(np.asarray(gold, dtype=object).astype(str), return_inverse=True)[1].astype(np.int64)


def pairs_within(sizes: np.ndarray) -> int:
    """sum of C(s, 2) over group sizes: the pairs inside the groups (exact Python int)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return int((sizes * (sizes - 1) // 2).sum())


def _counts(n: int, tp: int, predicted: int, gold_positive: int) -> PairCounts:
    fp, fn = predicted - tp, gold_positive - tp
    return PairCounts(tp, fp, fn, n * (n - 1) // 2 - tp - fp - fn)


def count_pairs(rows: np.ndarray, cols: np.ndarray, gold: Sequence) -> PairCounts:
    """Counts when the predicted positives are exactly the given pairs (the paper's reading).

    rows, cols (np.ndarray): The predicted pairs, each unordered pair once, no (i, i).
    gold (Sequence): Gold label per term.
    """
    codes = gold_codes(gold)
    tp = int(np.count_nonzero(codes[np.asarray(rows)] == codes[np.asarray(cols)]))
    return _counts(len(codes), tp, len(rows), pairs_within(np.bincount(codes)))


def count_clusters(labels: Sequence[int], gold: Sequence) -> PairCounts:
    """Counts when two terms are predicted together iff they share a predicted cluster id.

    labels (Sequence[int]): Predicted cluster id per term.
    gold (Sequence): Gold label per term.
    """
    codes, labels = gold_codes(gold, len(labels)), np.asarray(labels, dtype=np.int64)
    if not len(codes):
        return PairCounts(0, 0, 0, 0)
    _, labels = np.unique(labels, return_inverse=True)
    joint = np.unique(labels * (int(codes.max()) + 1) + codes, return_counts=True)[1]
    tp = pairs_within(joint)
    return _counts(len(codes), tp, pairs_within(np.bincount(labels)), pairs_within(np.bincount(codes)))


def count_brute_force(predicted_together, gold: Sequence, block: int = 2048) -> PairCounts:
    """The reference: every pair i < j looked at, in blocks of rows (O(n^2); for checking and timing).

    predicted_together (Callable): (i rows array, j columns array) -> boolean matrix of predicted pairs.
    gold (Sequence): Gold label per term.
    """
    codes = gold_codes(gold)
    n = len(codes)
    tp = fp = fn = tn = 0
    cols = np.arange(n)
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        upper = cols[None, :] > rows[:, None]
        same = (codes[rows][:, None] == codes[None, :]) & upper
        together = predicted_together(rows, cols) & upper
        tp += int(np.count_nonzero(same & together))
        fp += int(np.count_nonzero(~same & together))
        fn += int(np.count_nonzero(same & ~together))
        tn += int(np.count_nonzero(upper & ~same & ~together))
    return PairCounts(tp, fp, fn, tn)
