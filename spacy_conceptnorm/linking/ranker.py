"""The second-stage ranker: orders each mention's candidates by a learned probability of being right.

The model is a listwise logistic regression (conditional logit: a softmax over each mention's candidates of a
linear score) over the candidate features (`candidates.FEATURES`) and, when given, one column per pair scorer
(Mondal et al.'s triplet CNN, a cross-encoder). `model = "hybrid"` keeps two
columns, the dense cosine and the TF-IDF score: BioSyn's hybrid of a dense and a sparse score with a learned
weight, the cheapest ranker. Mentions whose normalized text is a known name keep the sieve's answer (the fast
path) unless `fast_path` is off.

A `confidence_scorer` is a pair scorer trained with the ranker whose score is no ranking column: it scores the
answer (the mention and the answering name) as evidence for the confidence model (`Linker`, `pair_score`).

The model is fitted by the training package (`training.ranker_fit.fit_ranker`). It is three arrays (`WEIGHTS`),
saved as plain numbers: predicting is one matrix product, and loading a pipeline unpickles nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Dict, Optional  # noqa: UP035

import numpy as np
from spacy.util import registry

from ..errors import ConceptNormError, Errors
from ..search.sieve import Match
from .candidates import DENSE_K, FEATURES, NGRAM_RANGE, CandidateSet
from .confidence import word_overlap
from .pair_scorer import PairScorer

# column sets: "hybrid" is BioSyn's dense + weighted sparse score; "hybrid_prior" adds how often annotators chose
# the concept (the default: best of the three on NCBI-disease dev, docs/benchmarks.md); "full" takes every feature
MODELS = {"hybrid": ("dense", "tfidf"), "hybrid_prior": ("dense", "tfidf", "count_prior"), "full": FEATURES}
WEIGHTS = ("mean", "scale", "coef")  # the saved model: per column, its mean and scale in training and its weight


class Ranker:
    """Rank candidate concepts with a learned model.

    model (str): The columns: "hybrid" (dense + learned weight x TF-IDF), "hybrid_prior" (+ the concept's
        annotation frequency) or "full" (every feature).
    scorers (Dict[str, PairScorer]): Learned pair scorers whose scores become extra columns (need training).
    confidence_scorer (Optional[PairScorer]): A learned pair scorer of each answer that is no known name, read by
        the confidence model only (the `pair_score` evidence), trained with the ranker.
    fast_path (bool): A mention that is a known name keeps the sieve's answer.
    dense_k (int): Candidates taken from the sieve.
    lexical_k (int): Names taken from each lexical score.
    ngram_range (Tuple[int, int]): Character n-gram sizes of the TF-IDF score.
    regularization (float): L2 penalty on the weights of the listwise model.
    """

    def __init__(
        self,
        model: str = "hybrid_prior",
        scorers: dict[str, PairScorer] | None = None,
        fast_path: bool = True,
        dense_k: int = DENSE_K,
        lexical_k: int = 10,
        regularization: float = 1e-3,
        ngram_range: tuple[int, int] = NGRAM_RANGE,
        confidence_scorer: PairScorer | None = None,
    ) -> None:
        if model not in MODELS:
            raise ConceptNormError(Errors.E310.format(model=model, choices=sorted(MODELS)))
        for key, value in (("dense_k", dense_k), ("lexical_k", lexical_k)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConceptNormError(Errors.E311.format(key=key, value=value))
        if not _ngram_range_ok(ngram_range):
            raise ConceptNormError(Errors.E316.format(value=ngram_range))
        if confidence_scorer is not None and "confidence_scorer" in (scorers or {}):
            raise ConceptNormError(Errors.E318)  # `pair_scorers` would drop that column's scorer
        self.scorers = dict(scorers or {})
        self.confidence_scorer = confidence_scorer
        for name, scorer in self.pair_scorers.items():
            if not isinstance(scorer, PairScorer):
                raise ConceptNormError(Errors.E315.format(name=name, found=type(scorer).__name__))
        self.model = model
        self.fast_path = fast_path
        self.dense_k = dense_k
        self.lexical_k = lexical_k
        self.regularization = regularization
        self.ngram_range = tuple(ngram_range)
        self.weights: dict[str, np.ndarray] | None = None  # "mean", "scale", "coef": one value per column
        # Learned with the weights: False when the fitted model ranked dev mentions worse than the sieve
        # (`train-ranker` decides), and the sieve's order and evidence are kept for every mention.
        self.reorder = True
        self.counts: dict[str, int] = {}  # concept id -> annotated training mentions (the `count_prior` feature)

    @property
    def columns(self) -> list[str]:
        return [*MODELS[self.model], *self.scorers]

    @property
    def is_fitted(self) -> bool:
        return self.weights is not None

    @property
    def pair_scorers(self) -> dict[str, PairScorer]:
        """Every pair scorer `train-ranker` fits: the columns' ones and the confidence scorer."""
        extra = {"confidence_scorer": self.confidence_scorer} if self.confidence_scorer is not None else {}
        return {**self.scorers, **extra}

    # --- features -----------------------------------------------------------------------------------------------
    def matrix(
        self, sets: Sequence[CandidateSet], mentions: Sequence[str], contexts: Sequence[str]
    ) -> list[np.ndarray]:
        """Per candidate set, its (candidates x columns) matrix."""
        base = [s.features[:, [FEATURES.index(f) for f in MODELS[self.model]]] for s in sets]
        extra = []
        for scorer in self.scorers.values():
            extra.append(scorer.score(mentions, [s.names for s in sets], contexts))
        return [np.column_stack([b, *(e[i].reshape(-1, 1) for e in extra)]) for i, b in enumerate(base)]

    # --- ranking --------------------------------------------------------------------------------------------------
    def probabilities(self, matrix: np.ndarray) -> np.ndarray:
        """Softmax over one candidate set of the linear scores: P(candidate is the right one | one is)."""
        w = self.weights
        z = ((matrix - w["mean"]) / w["scale"]) @ w["coef"]
        z = np.exp(z - z.max())
        return z / z.sum()

    def rerank(
        self, sets: Sequence[CandidateSet], mentions: Sequence[str], contexts: Sequence[str], top_k: int
    ) -> list[Match]:
        """The new Match of each candidate set: candidates ordered by probability, scores = probabilities.
        Fast-path sets, and every set when `reorder` is off, keep the sieve's order; their scores stay the
        sieve's cosines."""
        todo = [i for i, s in enumerate(sets) if len(s.concept_ids) and not (self.fast_path and s.exact)]
        out = [_evidence(s.sieve, s, None) for s in sets]
        if todo and self.is_fitted and self.reorder:
            mats = self.matrix([sets[i] for i in todo], [mentions[i] for i in todo], [contexts[i] for i in todo])
            for i, mat in zip(todo, mats):
                s = sets[i]
                probs = self.probabilities(mat)
                order = sorted(range(len(probs)), key=lambda j: (-round(float(probs[j]), 6), j))[:top_k]
                match = Match(
                    [(s.concept_ids[j], float(probs[j])) for j in order],
                    [s.names[j] for j in order],
                    s.sieve.stage,
                )
                out[i] = _evidence(match, s, probs[order])
        return out

    # --- serialization -------------------------------------------------------------------------------------------
    def weights_to_dict(self) -> dict | None:
        if self.weights is None:
            return None
        return {**{k: [float(x) for x in np.ravel(v)] for k, v in self.weights.items()}, "reorder": self.reorder}

    def weights_from_dict(self, data: dict | None, path: str | Path = "ranker") -> None:
        if data is None:
            self.weights = None
            self.reorder = True
            return
        try:
            weights = {k: np.asarray(data[k], dtype=np.float64).reshape(-1) for k in WEIGHTS}
            reorder = data["reorder"]
        except KeyError as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"ranker weights without {e}")) from None
        except (TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"ranker weights: {e}")) from None
        if any(len(w) != len(self.columns) for w in weights.values()):
            raise ConceptNormError(Errors.E302.format(path=path, detail="the ranker's weights do not fit its columns"))
        if not isinstance(reorder, bool):
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"ranker reorder: {reorder!r}"))
        self.weights, self.reorder = weights, reorder  # both or neither: a refused file changes nothing


def _ngram_range_ok(value: object) -> bool:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return False
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in value):
        return False
    return 1 <= value[0] <= value[1]


def _evidence(match: Match, cands: CandidateSet, probs: np.ndarray | None) -> Match:
    """Attach the evidence the confidence model reads (see `sieve_evidence`); a re-ranked match's scores are
    its probabilities, and its dense value is the top candidate's cosine."""
    if probs is None:
        return sieve_evidence(match, cands.key, cands.exact)
    top = match.candidates[0][0] if match.candidates else None
    dense = float(cands.features[cands.concept_ids.index(top), FEATURES.index("dense")]) if top else 0.0
    return _with_evidence(match, cands.key, list(map(float, probs)), dense, cands.exact)


def sieve_evidence(match: Match, key: str, exact: bool) -> Match:
    """The evidence of a sieve answer for the normalized mention `key`: its top cosine, the margin to the
    runner-up, whether the mention is a known name (of a searchable concept), whether the domain stage answered,
    and the word overlap of the mention and the answering name (the linker then adds the answering concept's prior:
    `Linker._add_answer_evidence`)."""
    scores = [s for _, s in match.candidates]
    return _with_evidence(match, key, scores, scores[0] if scores else 0.0, exact)


def _with_evidence(match: Match, key: str, scores: list[float], dense: float, exact: bool) -> Match:
    if scores:
        match.evidence = {
            "score": scores[0],
            "margin": scores[0] - scores[1] if len(scores) > 1 else 1.0,
            "dense": dense,
            "exact": float(exact),
            "domain_stage": float(match.stage is not None and match.stage.startswith("D-")),
            **word_overlap(key, match.names[0] if match.names else ""),
        }
    return match


@registry.misc("spacy_conceptnorm.ranker.v1")
def make_ranker(
    model: str = "hybrid_prior",
    # Optional[Dict[str, Any]]: confection resolves the scorers' sub-sections under it, not under a dict of a
    # class or `dict | None`; Ranker checks that each is a PairScorer
    scorers: Optional[Dict[str, Any]] = None,  # noqa: UP006, UP045
    fast_path: bool = True,
    dense_k: int = DENSE_K,
    lexical_k: int = 10,
    regularization: float = 1e-3,
    ngram_range: Sequence[int] = NGRAM_RANGE,  # a config gives a list: [3, 3]
    confidence_scorer: Optional[Any] = None,  # noqa: UP045 (a PairScorer sub-section; Ranker checks it)
) -> Ranker:
    """A config's ranker: `@misc = "spacy_conceptnorm.ranker.v1"`, with pair scorers as sub-sections."""
    return Ranker(model, scorers, fast_path, dense_k, lexical_k, regularization, ngram_range, confidence_scorer)
