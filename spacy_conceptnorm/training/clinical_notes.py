"""Annotated clinical notes as training docs for the recognizer.

The whole notes of docs/clinical_notes/whole, in the JSONL that `evaluate-assertion` reads, mark every condition a
note names (diseases, symptoms, signs, abnormal findings, injuries), whatever its status: a recognizer trained on
abstracts alone finds the diseases but few of the signs and symptoms that notes are mostly made of. Each text
becomes one Doc whose entities are its annotated spans, of one label, widened to token boundaries; the concept id,
where a span has one, is the entity's `kb_id_`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc, Span

from ..errors import ConceptNormError, Errors
from ..evaluation.assertion import read_annotated_spans, spans_by_text


def notes_to_docs(nlp: Language, path: str | Path, label: str = "Disease") -> Iterator[Doc]:
    """The annotated texts of `path` as Docs with the spans as entities, in file order. Two spans that overlap
    once widened to tokens raise E626, naming the line.

    nlp (Language): The pipeline whose tokenizer splits the texts.
    path (Union[str, Path]): The JSONL file (one span a line, or one text with its spans).
    label (str): The label of every entity.
    YIELDS (Doc): One doc a distinct text.
    """
    for text, spans in spans_by_text(read_annotated_spans(path)).items():
        doc = nlp.make_doc(text)
        ents: list[Span] = []
        for span in sorted(spans, key=lambda s: (s.start, s.end)):
            ent = doc.char_span(span.start, span.end, label=label, kb_id=span.concept_id or "", alignment_mode="expand")
            if ent is None or (ents and ent.start < ents[-1].end):
                raise ConceptNormError(Errors.E626.format(path=path, line=span.line, start=span.start, end=span.end))
            ents.append(ent)
        doc.ents = ents
        yield doc
