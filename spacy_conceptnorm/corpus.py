"""Annotated corpora: PubTator files (NCBI-disease, BC5CDR) to spaCy Docs with gold entities and concept ids.

PubTator is read with the `bioc` package. Each mention becomes an entity whose `kb_id_` is the gold concept id
as written (composites keep their `|`); offsets are checked against the text so a corrupt file fails loudly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import spacy
from bioc import pubtator
from spacy.language import Language
from spacy.tokens import Doc, DocBin, Span
from spacy.util import filter_spans, registry

from .errors import ConceptNormError, Errors
from .util import read_lines


def read_pubtator(path: str | Path) -> Iterator[pubtator.PubTator]:
    """PubTator documents of a file; each annotation's text is checked against the document text."""
    path = Path(path)
    lines = (line for _, line in read_lines(path))
    try:
        for doc in pubtator.iterparse(lines):
            text = doc.text
            for ann in doc.annotations:
                if text[ann.start : ann.end].strip() != ann.text.strip():
                    raise ConceptNormError(
                        Errors.E601.format(path=path, pmid=doc.pmid, start=ann.start, end=ann.end, text=ann.text)
                    )
            yield doc
    except ValueError as e:
        if isinstance(e, ConceptNormError):
            raise
        raise ConceptNormError(Errors.E602.format(path=path, detail=e)) from None


def pubtator_to_docs(nlp: Language, path: str | Path, label: str | None = "Disease") -> Iterator[Doc]:
    """spaCy Docs with gold entities (`kb_id_` = concept id) from a PubTator file.

    nlp (Language): Provides the tokenizer.
    path (Path): The PubTator file.
    label (Optional[str]): The entity label for every mention; None keeps the mention type (SpecificDisease, ...).
    """
    for record in read_pubtator(path):
        doc = _make_aligned_doc(nlp, record.text, {b for a in record.annotations for b in (a.start, a.end)})
        doc.user_data["pmid"] = record.pmid
        spans = [
            doc.char_span(a.start, a.end, label=label or a.type, kb_id=a.id, alignment_mode="expand")
            for a in record.annotations
        ]
        doc.ents = filter_spans([s for s in spans if s is not None])
        yield doc


def read_docs(path: str | Path, nlp: Language | None = None) -> Iterator[Doc]:
    """Docs with gold entities from a PubTator file, a `.spacy` DocBin, or a folder of `.spacy` files."""
    path = Path(path)
    nlp = nlp or spacy.blank("en")
    if path.is_dir():
        files = sorted(path.glob("*.spacy"))
        if not files:
            raise ConceptNormError(Errors.E707.format(path=path))
        for file in files:
            yield from DocBin().from_disk(file).get_docs(nlp.vocab)
    elif not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    elif path.suffix == ".spacy":
        try:
            docs = list(DocBin().from_disk(path).get_docs(nlp.vocab))
        except ValueError as e:
            raise ConceptNormError(Errors.E707.format(path=path) + f" ({e})") from None
        yield from docs
    else:
        yield from pubtator_to_docs(nlp, path)


def _make_aligned_doc(nlp: Language, text: str, boundaries: set[int]) -> Doc:
    """Tokenize so that every mention boundary is a token boundary (the tokenizer alone keeps `type I.` whole),
    so gold entities have exactly the annotated text."""
    cuts = sorted({0, len(text), *boundaries})
    words, spaces = [], []
    for start, end in zip(cuts, cuts[1:]):
        for token in nlp.tokenizer(text[start:end]):
            words.append(token.text)
            spaces.append(bool(token.whitespace_))
    return Doc(nlp.vocab, words=words, spaces=spaces)


def mention_spans(docs: Iterable[Doc]) -> Iterator[Span]:
    """Every gold entity that carries a concept id."""
    for doc in docs:
        yield from (ent for ent in doc.ents if ent.kb_id_)


@registry.misc("spacy_conceptnorm.domain_synonyms.v1")
def read_domain_synonyms(path: str | Path | None, nlp_lang: str = "en") -> list[tuple[str, str]]:
    """(mention text, gold id) pairs to use as domain synonyms, from a `.spacy` DocBin, a PubTator file, or every
    such file in a directory. Composite gold ids (`|`, `+`) are left out. None gives no pairs.

    path (Optional[Path]): A file or a directory.
    nlp_lang (str): Language of the tokenizer used to read PubTator files.
    """
    if path is None:
        return []
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    files = sorted(p for p in path.iterdir() if p.suffix in (".spacy", ".txt")) if path.is_dir() else [path]
    nlp = spacy.blank(nlp_lang)
    pairs = []
    for file in files:
        docs = read_docs(file, nlp)
        pairs.extend((e.text, e.kb_id_) for e in mention_spans(docs) if not any(c in e.kb_id_ for c in "|+"))
    return pairs


def strip_links(docs: list[Doc]) -> list[Doc]:
    """Copies of the docs whose entities keep their offsets and labels but lose their gold ids."""
    out = []
    for doc in docs:
        copy = Doc(doc.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])
        copy.ents = [copy.char_span(e.start_char, e.end_char, label=e.label_) for e in doc.ents]
        out.append(copy)
    return out
