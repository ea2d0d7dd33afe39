"""Semantic similarity and relatedness (Phan et al. 2019, section 4.4), over any name encoder.

Spearman's rank correlation between the cosine of two terms' vectors and human scores, for a CSV (or TSV) of
term pairs in the shape of UMNSRS and MayoSRS: a header, then one pair per row, the two terms and the score in
columns named by the caller.

    pairs = read_term_pairs("UMNSRS_similarity.csv", term1="Term1", term2="Term2", score="Mean")
    result = similarity_correlation(encoder, pairs)  # {"spearman": ..., "pairs_used": ..., ...}

Bad rows (an empty term, a score that is not a finite number, too few fields) are skipped and counted, with their
line numbers; with `strict=True` the first one raises ConceptNormError naming file:line instead.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConceptNormError, Errors
from ..io.files import read_lines

SKIPPED_SHOWN = 20  # skipped rows listed (line and reason) in a result; all are counted


@dataclass
class TermPairs:
    """Term pairs with human scores, read from `source`.

    term1, term2 (List[str]): The two terms of each pair. scores (np.ndarray): float64 human scores.
    lines (List[int]): The line of each pair in the file. skipped (List[Tuple[int, str]]): (line, reason) of each
    row left out.
    """

    term1: list[str]
    term2: list[str]
    scores: np.ndarray
    lines: list[int] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.term1)


def _column(header: Sequence[str], name: str, what: str, path: Path) -> int:
    """Index of `name` in the header: an exact match, else the only match ignoring case and outer spaces."""
    if name in header:
        return list(header).index(name)
    folded = [i for i, h in enumerate(header) if h.strip().casefold() == name.strip().casefold()]
    if len(folded) == 1:
        return folded[0]
    raise ConceptNormError(Errors.E966.format(path=path, column=name, what=what, header=list(header)))


def read_term_pairs(
    path: str | Path,
    term1: str = "term1",
    term2: str = "term2",
    score: str = "score",
    delimiter: str | None = None,
    strict: bool = False,
) -> TermPairs:
    """Read a CSV/TSV of scored term pairs (plain or .gz, UTF-8).

    path (Path): The file; its first row is the header.
    term1, term2, score (str): The column names (an exact match, else the only one equal ignoring case).
    delimiter (str): The field separator; None: a tab if the header has one, else a comma.
    strict (bool): Raise ConceptNormError naming file:line at the first bad row instead of skipping it.
    RETURNS (TermPairs): The usable pairs, and the skipped rows with their reasons.
    """
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E965.format(path=path))
    numbered = read_lines(path)
    header_line = next(((n, line) for n, line in numbered if line.strip()), None)
    if header_line is None:
        raise ConceptNormError(Errors.E968.format(path=path, n=0, skipped=0))
    delimiter = delimiter or ("\t" if "\t" in header_line[1] else ",")
    header = next(csv.reader([header_line[1]], delimiter=delimiter))
    columns = [_column(header, name, what, path) for name, what in ((term1, "term1"), (term2, "term2"),
                                                                        (score, "the score"))]  # fmt: skip
    pairs = TermPairs([], [], np.zeros(0), source=str(path))
    scores = []
    for lineno, line in numbered:
        if not line.strip():
            continue
        row = next(csv.reader([line], delimiter=delimiter))
        reason = _problem(row, columns)
        if reason is not None:
            if strict:
                raise ConceptNormError(Errors.E967.format(path=path, line=lineno, detail=reason))
            pairs.skipped.append((lineno, reason))
            continue
        pairs.term1.append(row[columns[0]].strip())
        pairs.term2.append(row[columns[1]].strip())
        scores.append(float(row[columns[2]]))
        pairs.lines.append(lineno)
    pairs.scores = np.array(scores, dtype=np.float64)
    return pairs


def _problem(row: list[str], columns: list[int]) -> str | None:
    """Why a row cannot be used, or None."""
    if len(row) <= max(columns):
        return f"{len(row)} fields, the columns need {max(columns) + 1}"
    for column, which in zip(columns[:2], ("term1", "term2")):
        if not row[column].strip():
            return f"empty {which}"
    try:
        value = float(row[columns[2]])
    except ValueError:
        return f"score {row[columns[2]]!r} is not a number"
    if not math.isfinite(value):
        return f"score {row[columns[2]]!r} is not a finite number"
    return None


def pair_cosines(encoder, term1: Sequence[str], term2: Sequence[str]) -> np.ndarray:
    """The cosine of each pair's vectors; each distinct term is encoded once. The rows are normalized here, so
    an encoder need not return unit vectors (a zero vector has cosine 0 with anything)."""
    texts = list(dict.fromkeys([*term1, *term2]))
    if not texts:
        return np.zeros(0)
    vectors = np.asarray(encoder.encode(texts), dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    row = {t: i for i, t in enumerate(texts)}
    a = vectors[[row[t] for t in term1]]
    b = vectors[[row[t] for t in term2]]
    return np.clip((a * b).sum(axis=1), -1.0, 1.0)


def similarity_correlation(encoder, pairs: TermPairs) -> dict:
    """Spearman's ρ between the cosines of the pairs and their human scores (scipy.stats.spearmanr: ties get
    their average rank).

    encoder: Anything with `encode(texts)` returning one vector per text (a NameEncoder, a BNEEncoder, ...).
    pairs (TermPairs): From `read_term_pairs`.
    RETURNS (dict): "spearman" (NaN when the cosines or the scores are all equal), "p_value", "pairs_used",
        "pairs_skipped", "skipped" (the first SKIPPED_SHOWN as {"line", "reason"}), "file".
    """
    from scipy.stats import spearmanr

    if len(pairs) < 2:
        raise ConceptNormError(Errors.E968.format(path=pairs.source, n=len(pairs), skipped=len(pairs.skipped)))
    cosines = pair_cosines(encoder, pairs.term1, pairs.term2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: scipy warns and returns NaN, which we report
        rho, p_value = spearmanr(cosines, pairs.scores)
    return {
        "spearman": float(rho),
        "p_value": float(p_value),
        "pairs_used": len(pairs),
        "pairs_skipped": len(pairs.skipped),
        "skipped": [{"line": line, "reason": reason} for line, reason in pairs.skipped[:SKIPPED_SHOWN]],
        "file": pairs.source,
    }
