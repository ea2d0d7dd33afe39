"""Document consistency for linked entities (after the linker, before the doc is handed on).

Two rules, each applied only to links the linker is not confident about (`confidence < confident`):
- one normalized mention text gets one concept in a document: the concept whose links of that text carry the
  most confidence in total wins;
- an abbreviation with no definition in the text (no `long_form`) whose letters are the initials of another
  linked entity of the document takes that entity's concept ("DMD" after "Duchenne muscular dystrophy").
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence

from spacy.tokens import Doc, Span

NIL = "NIL"
ABBREVIATION = re.compile(r"^[A-Z][A-Za-z0-9]{1,9}s?$")
_SKIP = {"of", "and", "the", "in", "with", "to", "for", "or"}


def initials(text: str) -> str:
    """Upper-cased first letters of the words of `text`, skipping small function words; hyphens split words."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    return "".join(w[0] for w in words if w.lower() not in _SKIP).upper()


def make_consistent(
    doc: Doc, ents: Sequence[Span], normalize: Callable[[str], str], nil_threshold: float, confident: float = 0.9
) -> int:
    """Apply both rules to the linked single-concept entities `ents` of `doc`. RETURNS (int): links changed."""
    single = [e for e in ents if e._.kb_parts and len(e._.kb_parts) == 1]
    changes: dict[Span, Span] = {}
    groups: dict[str, list[Span]] = defaultdict(list)
    for ent in single:
        groups[normalize(ent.text)].append(ent)
    for members in groups.values():
        votes: dict[str, float] = defaultdict(float)
        for ent in members:
            if ent.kb_id_ != NIL:
                votes[ent.kb_id_] += ent._.kb_confidence or 0.0
        if len(votes) < 1:
            continue
        winner = max(sorted(votes), key=votes.get)
        donor = max((e for e in members if e.kb_id_ == winner), key=lambda e: e._.kb_confidence or 0.0)
        for ent in members:
            if ent.kb_id_ != winner and (ent._.kb_confidence or 0.0) < confident:
                changes[ent] = donor
    by_initials = {}
    for ent in single:
        if ent.kb_id_ != NIL and len(ent) > 1:
            by_initials.setdefault(initials(ent.text), ent)
    for ent in single:
        long_form = ent._.long_form if ent.has_extension("long_form") else None
        text = ent.text.rstrip("s") if ent.text.endswith("s") and len(ent.text) > 2 else ent.text
        donor = by_initials.get(text.upper()) if ABBREVIATION.match(ent.text) and not long_form else None
        if donor is not None and ent not in changes and donor.kb_id_ != ent.kb_id_:
            if (ent._.kb_confidence or 0.0) < confident:
                changes[ent] = donor
    if changes:
        _apply(doc, changes, nil_threshold)
    return len(changes)


def _apply(doc: Doc, changes: dict[Span, Span], nil_threshold: float) -> None:
    """Give each changed entity its donor's concept (and the donor's confidence, candidates and name)."""
    new_ents = []
    for ent in doc.ents:
        donor = changes.get(ent)
        if donor is None:
            new_ents.append(ent)
            continue
        confidence = donor._.kb_confidence or 0.0
        kb_id = donor.kb_id_ if confidence >= nil_threshold else NIL
        record = {**ent._.kb_parts[0], "kb_id": kb_id, "name": donor._.kb_name, "confidence": confidence}
        record["candidates"] = _promoted(ent._.kb_ents or [], donor.kb_id_, confidence)
        record["stage"] = "consistency"
        span = Span(doc, ent.start, ent.end, label=ent.label, kb_id=kb_id, span_id=ent.id)
        new_ents.append(span)
        span._.kb_parts = [record]
        span._.kb_ents = record["candidates"]
        span._.kb_name = donor._.kb_name
        span._.kb_stage = "consistency"
        span._.kb_confidence = confidence
    doc.ents = new_ents


def _promoted(candidates: list[tuple[str, float]], concept_id: str, score: float) -> list[tuple[str, float]]:
    """The candidate list with `concept_id` moved to the front at `score`."""
    return [(concept_id, score)] + [(c, s) for c, s in candidates if c != concept_id]
