"""Linking accuracy with the papers' conventions.

A gold id matches a predicted concept when it is any of the concept's ids (MeSH or OMIM for MEDIC). A gold
composite (`id|id`, or `id+id` for a conjunctive concept) is right only if every gold id is predicted: at k, each
gold id must be among the top-k candidates of some predicted part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from spacy.training import Example
from spacy.util import registry

from ..kb.knowledge_base import KnowledgeBase

NIL = "NIL"
_GOLD_SEP = re.compile(r"[|+]")


def gold_ids(gold: str) -> list[str]:
    """`"D001|OMIM:123"` -> `["D001", "OMIM:123"]`."""
    return [g.strip() for g in _GOLD_SEP.split(gold) if g.strip()]


def concept_pairs(kb: KnowledgeBase, mentions: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Distinct (normalized mention, concept id) pairs of the single-concept (text, gold id) mentions whose id
    is in the KB, in first-seen order."""
    pairs = {}
    for text, gold in mentions:
        ids = gold_ids(gold)
        cid = kb.resolve(ids[0]) if len(ids) == 1 else None
        key = kb.normalizer(text)
        if cid is not None and key:
            pairs[(key, cid)] = None
    return list(pairs)


def is_correct(kb: KnowledgeBase | None, gold: str, parts: Sequence[Sequence[str]], k: int = 1) -> bool:
    """Whether predicted parts (each a candidate list of concept ids, best first) get a gold id string right."""
    predicted = {cid for candidates in parts for cid in list(candidates)[:k]}
    ids = gold_ids(gold)
    if not ids:
        return False
    if kb is None:
        return all(g in predicted for g in ids)
    return all(g in predicted or kb.resolve(g) in predicted for g in ids)


def accuracy_at(kb: KnowledgeBase | None, pairs: Iterable[tuple[str, Sequence[Sequence[str]]]], k: int) -> float:
    pairs = list(pairs)
    return sum(is_correct(kb, gold, parts, k) for gold, parts in pairs) / len(pairs) if pairs else 0.0


def predicted_parts(span) -> list[list[str]]:
    """Candidate ids per part of a linked span (empty when the span was not linked)."""
    parts = span._.kb_parts if span.has_extension("kb_parts") else None
    if parts:
        return [[cid for cid, _ in part["candidates"]] for part in parts]
    return [[span.kb_id_]] if span.kb_id_ and span.kb_id_ != NIL else []


def score_linking(examples: Iterable[Example], kb: KnowledgeBase | None = None, **_: Any) -> dict[str, float]:
    """Accuracy@1 and @5 over gold entities that carry a concept id and that the prediction also found (same
    offsets), plus how many gold linked entities were found (`kb_found`)."""
    at1 = at5 = found = total = 0
    for eg in examples:
        predicted = {(e.start_char, e.end_char): e for e in eg.predicted.ents}
        for gold in eg.reference.ents:
            if not gold.kb_id_ or gold.kb_id_ == NIL:
                continue
            total += 1
            span = predicted.get((gold.start_char, gold.end_char))
            if span is None:
                continue
            found += 1
            parts = predicted_parts(span)
            at1 += is_correct(kb, gold.kb_id_, parts, 1)
            at5 += is_correct(kb, gold.kb_id_, parts, 5)
    return {
        "kb_acc": at1 / found if found else 0.0,
        "kb_acc5": at5 / found if found else 0.0,
        "kb_found": found / total if total else 0.0,
    }


@registry.scorers("spacy_conceptnorm.linking_scorer.v1")
def make_linking_scorer():
    return score_linking
