"""Boundary errors of a recognizer, as categories: what kind of span mistake each wrong entity is.

Predicted and gold entities of one text are grouped by overlap (a group: entities linked by overlapping
characters; an exact match is its own group). A group that is not one exact match is one error, of a kind:

- `spurious`: predicted entities that overlap no gold entity;
- `missed`: gold entities that overlap no predicted entity;
- `coordination`: the words where the two sides differ hold a coordinator ("and", "or", ",", "/"), as when
  "breast and ovarian cancer" is found as "ovarian cancer", or two coordinated mentions are found as one;
- `extra_words`: one predicted entity holds one gold entity and more words ("familial [breast cancer]");
- `missing_words`: one predicted entity lies inside one gold entity ("hereditary [breast cancer]" found without
  "hereditary");
- `crossing`: anything else that overlaps (spans that cross, several entities on one side).

Spans only: labels are not compared (NCBI-disease has one). `words` counts the lowercased words added or dropped
by the `extra_words` and `missing_words` errors, so the modifiers ("hereditary", "familial") that the recognizer
takes or leaves show up by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from spacy.tokens import Doc

COORDINATORS = frozenset({"and", "or", "nor", ",", "/", "and/or", "&"})
CATEGORIES = ("exact", "spurious", "missed", "coordination", "extra_words", "missing_words", "crossing")


def boundary_errors(pairs: Iterable[tuple[Doc, Doc]], top: int = 20) -> dict:
    """Count the boundary-error categories over (gold doc, predicted doc) pairs of the same text.

    pairs (Iterable[Tuple[Doc, Doc]]): Gold docs and the docs the recognizer predicted on their texts.
    top (int): How many of the most frequent added or dropped words to list.
    RETURNS (dict): A count per category of `CATEGORIES` (`exact`: entities right; the others: errors), and
        "words": {"extra": [[word, count], ...], "missing": [...]}, most frequent first.
    """
    counts = Counter({category: 0 for category in CATEGORIES})
    words: dict[str, Counter] = {"extra": Counter(), "missing": Counter()}
    for gold_doc, pred_doc in pairs:
        gold = sorted({(e.start_char, e.end_char) for e in gold_doc.ents})
        pred = sorted({(e.start_char, e.end_char) for e in pred_doc.ents})
        for gold_group, pred_group in _overlap_groups(gold, pred):
            category, diff = _categorize(pred_doc, gold_group, pred_group)
            counts[category] += 1
            if category in ("extra_words", "missing_words"):
                words[category.split("_")[0]].update(diff)
    return {
        **{category: counts[category] for category in CATEGORIES},
        "words": {side: [[w, n] for w, n in c.most_common(top)] for side, c in words.items()},
    }


def _overlap_groups(
    gold: list[tuple[int, int]], pred: list[tuple[int, int]]
) -> list[tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Connected groups of overlapping spans, as (gold spans, predicted spans); spans are sorted by start."""
    spans = sorted([(s, e, "g") for s, e in gold] + [(s, e, "p") for s, e in pred])
    groups: list[tuple[list, list]] = []
    end = -1
    for start, stop, side in spans:
        if not groups or start >= end:
            groups.append(([], []))
            end = stop
        else:
            end = max(end, stop)
        groups[-1][0 if side == "g" else 1].append((start, stop))
    return groups


def _categorize(doc: Doc, gold: list[tuple[int, int]], pred: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """The category of one overlap group and the lowercased words by which its two sides differ."""
    if not pred:
        return "missed", []
    if not gold:
        return "spurious", []
    if gold == pred:
        return "exact", []
    gold_chars = {i for s, e in gold for i in range(s, e)}
    pred_chars = {i for s, e in pred for i in range(s, e)}
    lo, hi = min(gold_chars | pred_chars), max(gold_chars | pred_chars) + 1
    differ = gold_chars ^ pred_chars
    diff = [
        t.lower_ for t in doc.char_span(lo, hi, alignment_mode="expand") if differ & set(range(t.idx, t.idx + len(t)))
    ]
    if COORDINATORS.intersection(diff):
        return "coordination", diff
    if len(gold) == 1 and len(pred) == 1:
        if pred_chars > gold_chars:
            return "extra_words", diff
        if pred_chars < gold_chars:
            return "missing_words", diff
    return "crossing", diff
