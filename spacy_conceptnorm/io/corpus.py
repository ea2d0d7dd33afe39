"""Annotated corpora: PubTator files (NCBI-disease, BC5CDR) to spaCy Docs with gold entities and concept ids.

PubTator blocks are read into, and written from, the `bioc` package's data model (one reader and one writer,
also used by the `annotate` command). Each mention becomes an entity whose `kb_id_` is the gold concept id as
written (composites keep their `|`); offsets are checked against the text so a corrupt file fails loudly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path

import spacy
from bioc import pubtator
from spacy.language import Language
from spacy.tokens import Doc, DocBin, Span
from spacy.util import filter_spans, registry

from ..errors import ConceptNormError, Errors
from .files import read_lines

PUBTATOR_TEXT_LINE = re.compile(r"([^|\t]+)\|([ta])\|(.*)")  # PMID|t|title or PMID|a|abstract


def parse_pubtator(
    lines: Iterable[tuple[int, str | None]], report: Callable[[int, str], None]
) -> Iterator[tuple[int, pubtator.PubTator]]:
    """(first line number, document) of each blank-line-separated PubTator block, in `bioc`'s data model.

    Lines are kept as written: bioc's own reader strips them, which moves every abstract offset after a title
    that ends in a space, and reads an annotation with an empty concept id as a relation. A block with a line
    that does not fit is reported once, `report(line number, problem)`, and skipped; a line given as None (not
    decodable, reported by the caller) skips its block too.
    """
    doc, first, bad = pubtator.PubTator(), None, False
    for lineno, line in chain(lines, [(0, "")]):  # the sentinel ends the last block
        if line is not None and not line.strip():
            if first is not None and not bad:
                if doc.title is None:
                    report(first, "no 'PMID|t|title' line")
                else:
                    yield first, doc
            doc, first, bad = pubtator.PubTator(), None, False
            continue
        first = first or lineno
        if bad or line is None:  # one report per block
            bad = True
            continue
        problem = _add_pubtator_line(doc, line)
        if problem:
            report(lineno, problem)
            bad = True


def _add_pubtator_line(doc: pubtator.PubTator, line: str) -> str | None:
    """Add a title, abstract, annotation or relation line to `doc`; the problem when the line does not fit."""
    match = PUBTATOR_TEXT_LINE.fullmatch(line)
    if match:
        pmid, kind, text = match.groups()
        part = "title" if kind == "t" else "abstract"
        if doc.pmid not in (None, pmid):
            return f"PMID {pmid} inside the block of PMID {doc.pmid} (is a blank line missing?)"
        if getattr(doc, part) is not None:
            return f"a second '|{kind}|' line"
        doc.pmid = pmid
        setattr(doc, part, text)
        return None
    if doc.title is None:
        return "expected a 'PMID|t|title' line"
    if not line.startswith(doc.pmid + "\t"):
        return f"expected a tab-separated annotation line of PMID {doc.pmid}"
    columns = line.rstrip(" ").split("\t")
    if len(columns) in (4, 5):
        doc.add_relation(pubtator.PubTatorRel(*columns))
        return None
    try:
        doc.add_annotation(pubtator.loads_ann(columns))
    except ValueError as e:
        return f"unreadable annotation line ({e})"
    return None


def read_pubtator(path: str | Path) -> Iterator[pubtator.PubTator]:
    """PubTator documents of a file; each annotation's text is checked against the document text."""
    path = Path(path)

    def fail(lineno: int, problem: str) -> None:
        raise ConceptNormError(Errors.E602.format(path=f"{path}:{lineno}", detail=problem))

    for _, doc in parse_pubtator(read_lines(path), fail):
        text = doc.text
        for ann in doc.annotations:
            if text[ann.start : ann.end].strip() != ann.text.strip():
                raise ConceptNormError(
                    Errors.E601.format(path=path, pmid=doc.pmid, start=ann.start, end=ann.end, text=ann.text)
                )
        yield doc


def pubtator_block(doc: pubtator.PubTator) -> str:
    """A document as a PubTator block: its title and abstract lines (line breaks and tabs written as spaces, so
    offsets hold), a `PMID\\tstart\\tend\\ttext\\ttype\\tid` line per annotation (and its further columns, if
    any), and a blank line. Unlike bioc's writer, the abstract line is written even when empty and annotation lines
    end without a tab."""
    lines = [f"{doc.pmid}|t|{_one_line(doc.title)}", f"{doc.pmid}|a|{_one_line(doc.abstract or '')}"]
    lines += [
        "\t".join(map(str, (doc.pmid, a.start, a.end, _one_line(a.text), a.type, a.id, *a.others)))
        for a in doc.annotations
    ]
    return "\n".join(lines) + "\n\n"


def _one_line(text: str) -> str:
    """Line breaks and tabs as spaces: same length, so offsets hold."""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


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
