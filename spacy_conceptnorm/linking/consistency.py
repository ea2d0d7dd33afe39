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
    """Apply both rules to the linked single-concept entities `ents` of `doc`. RETURNS (int): links changed.

    Each entity's text, id and confidence are read once (a Span's `text` and `_` attributes are slow to read), and
    a rule only looks further where it can change something: a text linked two ways, an undefined abbreviation."""
    single = []  # (entity, text, kb_id, confidence); `doc.text` would join every token of the doc
    for ent in ents:
        parts = ent._.kb_parts
        if parts and len(parts) == 1:
            single.append((ent, ent.text, ent.kb_id_, ent._.kb_confidence or 0.0))
    changes: dict[Span, Span] = {}
    groups: dict[str, list[tuple[Span, str, str, float]]] = defaultdict(list)
    for item in single:
        groups[normalize(item[1])].append(item)
    for members in groups.values():
        if len({kb_id for _, _, kb_id, _ in members}) < 2:  # linked one way (or never): nothing to change
            continue
        votes: dict[str, float] = defaultdict(float)
        for _, _, kb_id, conf in members:
            if kb_id != NIL:
                votes[kb_id] += conf
        if not votes:
            continue
        winner = max(sorted(votes), key=votes.get)
        donor = max((m for m in members if m[2] == winner), key=lambda m: m[3])[0]
        for ent, _, kb_id, conf in members:
            if kb_id != winner and conf < confident:
                changes[ent] = donor
    has_long_form = Span.has_extension("long_form")  # set by abbreviation_resolver
    abbreviations = [
        (ent, ent_text, kb_id, conf)
        for ent, ent_text, kb_id, conf in single
        if ABBREVIATION.match(ent_text) and conf < confident and ent not in changes
        and not (has_long_form and ent._.long_form)
    ]  # fmt: skip
    if abbreviations:
        by_initials: dict[str, tuple[Span, str]] = {}
        for ent, ent_text, kb_id, _ in single:
            if kb_id != NIL and len(ent) > 1:
                by_initials.setdefault(initials(ent_text), (ent, kb_id))
        for ent, ent_text, kb_id, _ in abbreviations:
            key = ent_text.rstrip("s") if ent_text.endswith("s") and len(ent_text) > 2 else ent_text
            donor = by_initials.get(key.upper())
            if donor is not None and donor[1] != kb_id:
                changes[ent] = donor[0]
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
