"""Evaluate the assertion status on annotated clinical text: the `evaluate-assertion` command.

The input is a JSONL file, one annotated span a line: `{"text": ..., "start": ..., "end": ..., "status": ...}`,
`status` one of negated, family, hypothetical, uncertain, historical or affirmed (`context.STATUSES`), and an
optional gold concept id, `concept_id` (or `id`). Lines with the same text are one document. A line may also hold
a whole document and its spans, `{"text": ..., "spans": [{"start": ..., "end": ..., "status": ...}, ...]}`, so that
a long note is written once rather than once for each of its spans.

Two things are measured, apart:

- the status, on the annotated spans themselves: each document is tokenized, its annotated spans made its
  entities, and the pipeline's `clinical_context` run over it, so a span the recognizer missed still counts; per
  status precision, recall and F1, the accuracy over all spans and the confusion of gold and predicted status;
- recognition, linking and the status of what was found: the whole pipeline runs on each text; a span is recognized
  if an entity overlaps it (`exact`: the entity that overlaps it most has the same offsets), linked if that entity
  has a concept id, and linked right if an entity that overlaps it is linked to the span's concept id (counted over
  the spans that give one). Each entity found is a condition if it overlaps an annotated span (the precision of
  recognition), and its status is right if it is the status of the span it overlaps most.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.tokens import Span

from ..errors import ConceptNormError, Errors
from ..io.files import read_lines
from ..pipeline.clinical_context import STATUSES

NIL = "NIL"


@dataclass(frozen=True)
class AnnotatedSpan:
    """One line of the input: a span of `text` and its gold status (and concept id, if given)."""

    line: int
    text: str
    start: int
    end: int
    status: str
    concept_id: str | None = None


def read_annotated_spans(path: str | Path) -> list[AnnotatedSpan]:
    """Read the JSONL input (see the module docstring); a bad line raises ConceptNormError naming it (E622).

    path (Union[str, Path]): The JSONL file.
    RETURNS (List[AnnotatedSpan]): The spans, in file order.
    """
    spans = []
    for line, raw in read_lines(path):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            text = record["text"]
            if not isinstance(text, str):
                raise TypeError("text must be a string")
            parts = record["spans"] if "spans" in record else [record]
            if not isinstance(parts, list):
                raise TypeError("spans must be a list")
            spans.extend(annotated_span(line, text, part) for part in parts)
        except (ValueError, KeyError, TypeError) as e:
            detail = f"{type(e).__name__}: {e}"
            raise ConceptNormError(Errors.E622.format(path=path, line=line, detail=detail)) from None
    if not spans:
        raise ConceptNormError(Errors.E623.format(path=path))
    return spans


def annotated_span(line: int, text: str, record: dict) -> AnnotatedSpan:
    """One span of `text` from its record (`start`, `end`, `status`, optional `concept_id` or `id`); a bad value
    raises ValueError, KeyError or TypeError, which the reader turns into E622 naming the line."""
    start, end, status = record["start"], record["end"], record["status"]
    if not all(type(x) is int for x in (start, end)):
        raise TypeError("start and end must be integers")
    if not 0 <= start < end <= len(text):
        raise ValueError(f"start {start} and end {end} are not a span of the {len(text)}-character text")
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    concept_id = record.get("concept_id", record.get("id"))
    if "concept_id" in record and "id" in record and record["id"] != concept_id:
        raise ValueError(f"concept_id {concept_id!r} and id {record['id']!r} differ")
    return AnnotatedSpan(line, text, start, end, status, str(concept_id) if concept_id else None)


def spans_by_text(spans: list[AnnotatedSpan]) -> dict[str, list[AnnotatedSpan]]:
    """The annotated spans of each distinct text (one document), texts and spans in the order of `spans`."""
    by_text: dict[str, list[AnnotatedSpan]] = defaultdict(list)
    for span in spans:
        by_text[span.text].append(span)
    return dict(by_text)


def clinical_context_name(nlp: Language) -> str:
    """The name of the pipeline's `clinical_context`; one with the default settings is added last if it has none."""
    names = [name for name in nlp.pipe_names if nlp.get_pipe_meta(name).factory == "clinical_context"]
    return names[0] if names else nlp.add_pipe("clinical_context").name


def non_overlapping_groups(spans: list[Span]) -> list[list[Span]]:
    """The spans in as few groups as needed for no two spans of a group to overlap (doc.ents cannot overlap)."""
    rounds: list[list[Span]] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        free = next((r for r in rounds if all(span.end <= s.start or s.end <= span.start for s in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(span)
    return rounds


def asserted_entities(nlp: Language, context: str, text: str, spans: list[AnnotatedSpan]) -> list[Span]:
    """Each annotated span of one text as the entity `clinical_context` read, its status set: the spans are made
    the entities of a doc of the text, in as many docs as it takes for none to overlap another of its doc."""
    entities = {}
    doc = nlp.make_doc(text)
    token_spans = {doc.char_span(s.start, s.end, alignment_mode="expand"): s for s in spans}
    for group in non_overlapping_groups(list(token_spans)):
        round_doc = nlp.make_doc(text)
        round_doc.ents = [Span(round_doc, s.start, s.end, label="ENTITY") for s in group]
        nlp.get_pipe(context)(round_doc)
        for span, ent in zip(group, round_doc.ents, strict=True):
            entities[token_spans[span]] = ent
    return [entities[s] for s in spans]


def predict_statuses(nlp: Language, context: str, text: str, spans: list[AnnotatedSpan]) -> list[str]:
    """The status `clinical_context` gives each annotated span of one text, the spans made the doc's entities."""
    return [ent._.assertion for ent in asserted_entities(nlp, context, text, spans)]


def overlapping(start: int, end: int, items: list[tuple[int, int, Any]]) -> list[tuple[int, Any]]:
    """(characters shared, item) for each (item start, item end, item) of `items` that shares characters with the
    text from `start` to `end`, in the order of `items`."""
    shared = ((min(end, e) - max(start, s), item) for s, e, item in items)
    return [(n, item) for n, item in shared if n > 0]


def most(overlap: list[tuple[int, Any]]) -> Any:
    """The item of `overlapping`'s answer that shares the most characters (the first of equals)."""
    return max(overlap, key=lambda x: x[0])[1]


def _prf(tp: int, fp: int, fn: int) -> dict:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def evaluate_assertions(nlp: Language, spans: list[AnnotatedSpan], batch_size: int = 32) -> dict:
    """Score the status on the annotated spans, and count how many the pipeline recognized and linked.

    nlp (Language): The pipeline; its `clinical_context` (one with the default settings is added if it has none)
        sets the status.
    spans (List[AnnotatedSpan]): The annotated spans (`read_annotated_spans`).
    batch_size (int): Texts per `nlp.pipe` batch.
    RETURNS (dict): `spans`, `accuracy`, `statuses` (per status: support, predicted, precision, recall, f1),
        `confusion` (gold status -> predicted status -> count), `recognition` (recognized, exact, linked,
        with_concept_id, recognized_with_concept_id, linked_right) and `found` (entities: found in all; conditions:
        those that overlap an annotated span; status_right: of those, the ones with the span's status).
    """
    context = clinical_context_name(nlp)
    by_text = spans_by_text(spans)
    texts = list(by_text)

    pairs = [
        (s.status, p)
        for text in texts
        for s, p in zip(by_text[text], predict_statuses(nlp, context, text, by_text[text]))
    ]
    confusion: dict[str, Counter] = defaultdict(Counter)
    for gold, predicted in pairs:
        confusion[gold][predicted] += 1
    statuses = {}
    for status in STATUSES:
        tp = confusion[status][status]
        support = sum(confusion[status].values())
        predicted = sum(row[status] for row in confusion.values())
        statuses[status] = {"support": support, "predicted": predicted, **_prf(tp, predicted - tp, support - tp)}

    counts = Counter()
    for text, doc in zip(texts, nlp.pipe(texts, batch_size=batch_size), strict=True):
        for ent in doc.ents:
            counts["entities"] += 1
            overlap = overlapping(ent.start_char, ent.end_char, [(s.start, s.end, s) for s in by_text[text]])
            if overlap:
                counts["conditions"] += 1
                counts["status_right"] += ent._.assertion == most(overlap).status
        for s in by_text[text]:
            overlap = overlapping(s.start, s.end, [(e.start_char, e.end_char, e) for e in doc.ents])
            if not overlap:
                continue
            ent = most(overlap)
            counts["recognized"] += 1
            counts["recognized_with_concept_id"] += s.concept_id is not None
            counts["exact"] += (ent.start_char, ent.end_char) == (s.start, s.end)
            counts["linked"] += ent.kb_id_ not in ("", NIL)
            counts["linked_right"] += s.concept_id is not None and any(e.kb_id_ == s.concept_id for _, e in overlap)
    recognition = {k: counts[k] for k in ("recognized", "exact", "linked")}
    recognition["with_concept_id"] = sum(s.concept_id is not None for s in spans)
    recognition["recognized_with_concept_id"] = counts["recognized_with_concept_id"]
    recognition["linked_right"] = counts["linked_right"]
    found = {k: counts[k] for k in ("entities", "conditions", "status_right")}
    return {
        "spans": len(spans),
        "texts": len(texts),
        "accuracy": sum(g == p for g, p in pairs) / len(pairs),
        "statuses": statuses,
        "confusion": {g: dict(row) for g, row in confusion.items()},
        "recognition": recognition,
        "found": found,
    }
