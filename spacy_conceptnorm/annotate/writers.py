"""Output writers of the `annotate` command: one document's entities as a JSONL line or a PubTator block."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import srsly
from bioc import pubtator
from spacy.tokens import Span

from ..errors import ConceptNormError, Errors
from ..io.corpus import pubtator_block
from ..pipeline import concept_normalizer as component  # noqa: F401  (registers the span extensions read below)

OUTPUT_FORMATS = ("jsonl", "pubtator")


def _top_score(candidates: list | None) -> float | None:
    return round(float(candidates[0][1]), 4) if candidates else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def entity_record(ent: Span, offset: int = 0) -> dict:
    """One entity of the JSONL output. `score` is the best candidate's score (of ent._.kb_ents); for a composite,
    the lowest of its parts' best scores; `confidence` is `ent._.kb_confidence`, the probability that the link is
    right; `parts` gives each part (text, concept_id, score, confidence, name, stage); `assertion` is
    `ent._.assertion` (negated, family, hypothetical, uncertain, historical or affirmed) where the pipeline ends
    with `clinical_context`."""
    parts = ent._.kb_parts or []
    part_records = [
        {"text": p["text"], "concept_id": p["kb_id"], "score": _top_score(p["candidates"]),
         "confidence": _rounded(p.get("confidence")), "name": p["name"], "stage": p["stage"]}
        for p in parts
    ]  # fmt: skip
    scores = [p["score"] for p in part_records if p["score"] is not None]
    record = {
        "start": ent.start_char + offset,
        "end": ent.end_char + offset,
        "text": ent.text,
        "label": ent.label_,
        "concept_id": ent.kb_id_ or None,
        "score": min(scores) if scores else None,
        "confidence": _rounded(ent._.kb_confidence),
        "name": ent._.kb_name,
        "stage": ent._.kb_stage,
    }
    if len(part_records) > 1:
        record["parts"] = part_records
    if Span.has_extension("assertion") and ent._.assertion is not None:
        record["assertion"] = ent._.assertion
    return record


def jsonl_record(doc_id: object, text: str, entities: list[dict], include_text: bool) -> str:
    record = {"id": doc_id, "text": text} if include_text else {"id": doc_id}
    return srsly.json_dumps({**record, "entities": entities}) + "\n"


def pubtator_record(doc_id: object, text: str, entities: list[dict], include_text: bool) -> str:
    """A PubTator block (`io.corpus.pubtator_block`); the text is always written (PubTator readers need it, and
    resume reads the title line). An entity's assertion status, where there is one, is a seventh column."""
    pmid = str(doc_id)
    title, _, abstract = text.partition("\n")
    doc = pubtator.PubTator(pmid, title, abstract)
    for e in entities:
        doc.add_annotation(
            pubtator.PubTatorAnn(
                pmid,
                e["start"],
                e["end"],
                e["text"],
                e["label"],
                e["concept_id"] or "",
                [e["assertion"]] if "assertion" in e else [],
            )
        )
    return pubtator_block(doc)


WRITERS: dict[str, Callable[[object, str, list[dict], bool], str]] = {
    "jsonl": jsonl_record,
    "pubtator": pubtator_record,
}


def detect_output_format(path: Path) -> str:
    formats = {".jsonl": "jsonl", ".pubtator": "pubtator", ".txt": "pubtator"}
    if path.suffix.lower() not in formats:
        raise ConceptNormError(Errors.E803.format(path=path))
    return formats[path.suffix.lower()]
