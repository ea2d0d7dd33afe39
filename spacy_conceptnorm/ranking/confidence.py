"""Calibrated confidence: the probability that a link is right.

A logistic regression (Platt scaling with a few more inputs) over the evidence the linker has for its answer
(`EVIDENCE`: the top score, its margin to the runner-up, the top candidate's dense cosine, whether the mention
is a known name, whether the domain stage answered), fitted on dev links labelled right or wrong. Before it is
fitted the confidence is the top score itself. `NIL` is decided on this probability (`calibrate`).

Expected calibration error and reliability bins follow Guo et al. (2017): equal-width bins of confidence, the
ECE the share-weighted mean |accuracy - confidence| over bins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConceptNormError, Errors

EVIDENCE = ("score", "margin", "dense", "exact", "domain_stage")


class Confidence:
    """Map a link's evidence to the probability that it is right."""

    def __init__(self) -> None:
        self.coef: np.ndarray | None = None
        self.intercept = 0.0

    @property
    def is_fitted(self) -> bool:
        return self.coef is not None

    def fit(self, evidence: Sequence[dict[str, float]], correct: Sequence[bool]) -> Confidence:
        from sklearn.linear_model import LogisticRegression

        y = np.asarray(correct, dtype=int)
        if y.sum() == 0 or y.sum() == len(y):
            raise ConceptNormError(Errors.E313.format(right=int(y.sum()), wrong=int(len(y) - y.sum())))
        model = LogisticRegression(C=1.0, max_iter=2000).fit(_matrix(evidence), y)
        self.coef, self.intercept = model.coef_[0].astype(np.float64), float(model.intercept_[0])
        return self

    def __call__(self, evidence: Sequence[dict[str, float]]) -> np.ndarray:
        """Probabilities, one per evidence dict (an empty dict, nothing found, gives 0)."""
        if not len(evidence):
            return np.zeros(0)
        if self.coef is None:
            return np.array([float(np.clip(e.get("score", 0.0), 0.0, 1.0)) for e in evidence])
        probs = 1.0 / (1.0 + np.exp(-(_matrix(evidence) @ self.coef + self.intercept)))
        return np.where([bool(e) for e in evidence], probs, 0.0)

    def to_dict(self) -> dict:
        return {"coef": None if self.coef is None else self.coef.tolist(), "intercept": self.intercept}

    def from_dict(self, data: dict) -> Confidence:
        self.coef = None if data.get("coef") is None else np.asarray(data["coef"], dtype=np.float64)
        self.intercept = float(data.get("intercept", 0.0))
        if self.coef is not None and len(self.coef) != len(EVIDENCE):
            raise ConceptNormError(Errors.E313.format(right="?", wrong="?"))
        return self


def _matrix(evidence: Sequence[dict[str, float]]) -> np.ndarray:
    return np.array([[e.get(k, 0.0) for k in EVIDENCE] for e in evidence], dtype=np.float64)


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
