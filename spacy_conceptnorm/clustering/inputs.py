"""What `cluster` reads: a term list, a knowledge base, or the NIL mentions of an `annotate` JSONL output.

Each becomes a `TermSet`: distinct texts to encode (each encoded once), how often each occurs, its surface
forms, and for a knowledge base the gold concept of each name.

- term list: one term per non-blank line, stripped; identical lines are one term (counted).
- knowledge base (any `load_kb` format): its ontology names, normalized as the linker encodes them; gold = the
  concept id. A name shared by several concepts (1,010 of MEDIC 2012's 71,924) has no single gold cluster, and
  pairwise gold needs a partition: by default (`ambiguous="drop"`) such names are left out; `"first"` keeps
  them under the first concept the ontology lists them for.
- annotate output: every entity whose `concept_id` is null or "NIL" (for a composite, every NIL part), grouped
  by normalized text (the linker's `TextNormalizer`); surface forms and documents are counted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConceptNormError, Errors
from ..io.files import read_lines
from ..kb.knowledge_base import ONTOLOGY, load_kb
from ..linking.scoring import NIL
from ..text.normalize import TextNormalizer

INPUT_FORMATS = ("auto", "terms", "kb", "annotate")
AMBIGUOUS = ("drop", "first")
KB_SUFFIXES = (".kb", ".tsv", ".obo", ".rrf")


@dataclass
class TermSet:
    """Terms to cluster.

    texts (list): The text encoded for each term (distinct).
    counts (list): Occurrences of each term in the input.
    surfaces (list): Per term, a Counter of the surface forms it was seen as.
    gold (list): Gold concept id per term (knowledge bases), else None.
    documents (list): Per term, the set of document ids it occurs in (annotate output), else None.
    dropped (int): Names left out as ambiguous (knowledge bases).
    """

    texts: list[str]
    counts: list[int]
    surfaces: list[Counter]
    gold: list[str] | None = None
    documents: list[set] | None = None
    dropped: int = 0
    source: str = field(default="terms")


def detect_format(path: Path) -> str:
    """ "kb" for .kb/.tsv/.obo/.rrf, a MEDIC-style `ID||name` first line or a .jsonl of KB records; "annotate" for
    a .jsonl whose first record has an "entities" list; else "terms"."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(KB_SUFFIXES):
        return "kb"
    first = next((line for _, line in read_lines(path) if line and line.strip()), None)
    if first is None:
        raise ConceptNormError(Errors.E952.format(path=path, what="no line"))
    if name.endswith((".jsonl", ".json")):
        try:
            record = json.loads(first)
        except ValueError:
            return "annotate"  # let the reader name the line
        return "annotate" if isinstance(record, dict) and "entities" in record else "kb"
    return "kb" if "||" in first else "terms"


def read_terms(path: str | Path) -> TermSet:
    """A term list: one term per line; blank lines skipped, identical terms merged and counted."""
    path = Path(path)
    counts: Counter = Counter(line.strip() for _, line in read_lines(path) if line.strip())
    if not counts:
        raise ConceptNormError(Errors.E952.format(path=path, what="no term"))
    texts = list(counts)
    return TermSet(texts, [counts[t] for t in texts], [Counter({t: counts[t]}) for t in texts], source="terms")


def kb_terms(kb, ambiguous: str = "drop") -> TermSet:
    """The ontology names of a KnowledgeBase with their concept ids as gold (see the module doc for `ambiguous`)."""
    if ambiguous not in AMBIGUOUS:
        raise ConceptNormError(Errors.E955.format(value=ambiguous, choices=AMBIGUOUS))
    texts, gold, dropped = [], [], 0
    for name in kb.names(ONTOLOGY):
        concepts = kb.concepts_for(name, sources=1)
        if len(concepts) > 1 and ambiguous == "drop":
            dropped += 1
            continue
        texts.append(name)
        gold.append(concepts[0])
    surfaces = [Counter({kb.surface(t): 1}) for t in texts]
    return TermSet(texts, [1] * len(texts), surfaces, gold=gold, dropped=dropped, source="kb")


def read_kb_terms(path: str | Path, ambiguous: str = "drop") -> TermSet:
    terms = kb_terms(load_kb(path), ambiguous)
    if not terms.texts:
        raise ConceptNormError(Errors.E952.format(path=path, what="no concept name"))
    return terms


def _nil_mentions(entity: dict) -> list[str]:
    parts = entity.get("parts") or [entity]
    return [p["text"] for p in parts if p.get("concept_id") in (None, "", NIL) and p.get("text")]


def read_nil_mentions(path: str | Path, normalizer: TextNormalizer | None = None) -> TermSet:
    """The NIL mentions of an `annotate` JSONL output, one term per normalized text.

    path (Path): One `{"id": ..., "entities": [{"text", "concept_id", ...}]}` object per line.
    normalizer (TextNormalizer): Groups mention texts; the default is the linker's.
    """
    path, normalizer = Path(path), normalizer or TextNormalizer()
    terms: dict[str, tuple[Counter, set]] = {}
    records = 0
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            entities = record["entities"]
            if not isinstance(entities, list):
                raise TypeError("'entities' is not a list")
            mentions = [text for entity in entities for text in _nil_mentions(entity)]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            detail = f"{type(e).__name__}: {e}"
            raise ConceptNormError(Errors.E953.format(path=path, line=lineno, detail=detail, text=line[:120])) from None
        records += 1
        for text in mentions:
            key = normalizer(text)
            if key:
                surfaces, documents = terms.setdefault(key, (Counter(), set()))
                surfaces[text.strip()] += 1
                documents.add(str(record.get("id")))
    if not records:
        raise ConceptNormError(Errors.E952.format(path=path, what="no annotate record"))
    texts = list(terms)
    return TermSet(
        texts,
        [sum(terms[t][0].values()) for t in texts],
        [terms[t][0] for t in texts],
        documents=[terms[t][1] for t in texts],
        source="annotate",
    )


def read_input(path: str | Path, input_format: str = "auto", ambiguous: str = "drop") -> TermSet:
    """Read TERMS as `cluster` does: `input_format` is "auto", "terms", "kb" or "annotate"."""
    path = Path(path)
    if input_format not in INPUT_FORMATS:
        raise ConceptNormError(Errors.E954.format(fmt=input_format, choices=INPUT_FORMATS))
    if not path.is_file():
        raise ConceptNormError(Errors.E957.format(path=path))
    fmt = detect_format(path) if input_format == "auto" else input_format
    if fmt == "kb":
        return read_kb_terms(path, ambiguous)
    if fmt == "annotate":
        return read_nil_mentions(path)
    return read_terms(path)
