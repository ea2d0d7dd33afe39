"""Calibrated confidence: the probability that a link is right.

A logistic regression (Platt scaling with a few more inputs) over the evidence the linker has for its answer
(`EVIDENCE`: the top score, its margin to the runner-up, the top candidate's dense cosine, whether the mention
is a known name, whether the domain stage answered, how the mention's words and the answering name's words
overlap: `word_overlap`, and the answering concept's prior: how often annotators chose it in training and how
many names the KB gives it), fitted on dev links labelled right or wrong. Before it is fitted the confidence is the
top score itself. `NIL` is decided on this probability (`calibrate`).

The word overlap tells an out-of-KB mention from a right link where the cosine alone cannot: a mention whose
concept is missing is answered by a sibling or a parent ("hereditary ovarian cancer" by "Ovarian Neoplasms"), with
words left over on one side. `calibrate` adds simulated out-of-KB links with a small weight (`fit(..., weight=)`).

The prior tells a frequent, well-named concept from the rare neighbour that answers for a missing one. It is 0 for
a mention that is a known name, which needs none: given to known names too, it would choose a frequent concept's
long form over a known abbreviation's own answer ("AAPC": attenuated adenomatous polyposis coli, not "adenomatous
polyposis coli").

With a `confidence_scorer` in the ranker (an option), `pair_score` is its score of the mention and the answering
name, 0 for a known name; a model fitted without one has no such column (`fit` takes the columns the evidence
has). docs/second-stage.md says how each input was chosen; docs/benchmarks.md has the figures.

Expected calibration error and reliability bins follow Guo et al. (2017): equal-width bins of confidence, the
ECE the share-weighted mean |accuracy - confidence| over bins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ConceptNormError, Errors

EVIDENCE = (
    "score",
    "margin",
    "dense",
    "exact",
    "domain_stage",
    "jaccard",  # the mention's and the answering name's words: |shared| / |either|
    "mention_left",  # share of the mention's words the name lacks
    "name_left",  # share of the name's words the mention lacks
    "count_prior",  # log(1 + training mentions annotated with the answering concept); 0 for a known name
    "names",  # log(1 + the answering concept's names in the KB); 0 for a known name
    "pair_score",  # the ranker's confidence_scorer on (mention, answering name); 0 for a known name; see above
)
WORD = re.compile(r"[^\W\d_]+|\d+")  # letters or digits: "MEN2" and "MEN 2" have the same words


def words(text: str) -> set[str]:
    """The words of a text, lowercased, with a plural "s" taken off ("tumors" and "tumor" are one word)."""
    found = WORD.findall(text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in found}


def word_overlap(mention: str, name: str) -> dict[str, float]:
    """The overlap evidence of a mention (its normalized text) and the name that answered it."""
    m, n = words(mention), words(name)
    return {
        "jaccard": len(m & n) / len(m | n) if m | n else 0.0,
        "mention_left": len(m - n) / len(m) if m else 0.0,
        "name_left": len(n - m) / len(n) if n else 0.0,
    }


class Confidence:
    """Map a link's evidence to the probability that it is right."""

    def __init__(self) -> None:
        self.coef: np.ndarray | None = None
        self.intercept = 0.0
        self.columns: tuple[str, ...] = EVIDENCE

    @property
    def is_fitted(self) -> bool:
        return self.coef is not None

    def fit(
        self, evidence: Sequence[dict[str, float]], correct: Sequence[bool], weight: Sequence[float] | None = None
    ) -> Confidence:
        """Fit on links labelled right or wrong.

        evidence (Sequence[Dict[str, float]]): Each link's evidence.
        correct (Sequence[bool]): Whether each link is right.
        weight (Optional[Sequence[float]]): Per link, its weight (None: 1 each); `calibrate` gives the links of
            simulated out-of-KB mentions a small total weight.
        """
        from sklearn.linear_model import LogisticRegression

        y = np.asarray(correct, dtype=int)
        if y.sum() == 0 or y.sum() == len(y):
            raise ConceptNormError(Errors.E313.format(right=int(y.sum()), wrong=int(len(y) - y.sum())))
        self.columns = tuple(k for k in EVIDENCE if any(k in e for e in evidence))  # pair_score: with a scorer
        model = LogisticRegression(C=1.0, max_iter=2000).fit(self._matrix(evidence), y, sample_weight=weight)
        self.coef, self.intercept = model.coef_[0].astype(np.float64), float(model.intercept_[0])
        return self

    def __call__(self, evidence: Sequence[dict[str, float]]) -> np.ndarray:
        """Probabilities, one per evidence dict (an empty dict, nothing found, gives 0)."""
        if not len(evidence):
            return np.zeros(0)
        if self.coef is None:
            return np.array([float(np.clip(e.get("score", 0.0), 0.0, 1.0)) for e in evidence])
        probs = 1.0 / (1.0 + np.exp(-(self._matrix(evidence) @ self.coef + self.intercept)))
        return np.where([bool(e) for e in evidence], probs, 0.0)

    def _matrix(self, evidence: Sequence[dict[str, float]]) -> np.ndarray:
        return np.array([[e.get(k, 0.0) for k in self.columns] for e in evidence], dtype=np.float64)

    def to_dict(self) -> dict:
        coef = None if self.coef is None else self.coef.tolist()
        return {"coef": coef, "intercept": self.intercept, "columns": list(self.columns)}

    def from_dict(self, data: dict, path: str | Path = "confidence") -> Confidence:
        """Read `to_dict`'s output; a model that does not fit its columns raises ConceptNormError naming `path`."""
        try:
            coef = None if data["coef"] is None else np.asarray(data["coef"], dtype=np.float64).reshape(-1)
            columns, intercept = tuple(data["columns"]), float(data["intercept"])
            known = set(columns) <= set(EVIDENCE)
        except KeyError as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"confidence model without {e}")) from None
        except (TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"confidence model: {e}")) from None
        if not known or (coef is not None and len(coef) != len(columns)):
            detail = f"confidence model: {len(coef) if coef is not None else 0} weights for columns {list(columns)}"
            raise ConceptNormError(Errors.E004.format(path=path, detail=detail))
        self.coef, self.intercept, self.columns = coef, intercept, columns
        return self


def reliability(probs: Sequence[float], correct: Sequence[bool], bins: int = 10) -> list[dict]:
    """Per equal-width confidence bin: its range, count, mean confidence and accuracy (empty bins left out)."""
    probs, correct = np.asarray(probs, dtype=float), np.asarray(correct, dtype=float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(probs, edges[1:-1]), 0, bins - 1)
    out = []
    for b in range(bins):
        mask = which == b
        if mask.any():
            out.append(
                {
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "count": int(mask.sum()),
                    "confidence": float(probs[mask].mean()),
                    "accuracy": float(correct[mask].mean()),
                }
            )
    return out


def expected_calibration_error(probs: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """ECE: sum over bins of (bin share) x |bin accuracy - bin mean confidence|."""
    n = len(probs)
    return (
        sum(b["count"] / n * abs(b["accuracy"] - b["confidence"]) for b in reliability(probs, correct, bins))
        if n
        else 0.0
    )
