"""`preprocess` and `preprocess-notes`: a PubTator corpus or annotated clinical notes to a .spacy DocBin of gold
entities."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ._util import app

if TYPE_CHECKING:
    from spacy.tokens import DocBin


def write_doc_bin(doc_bin: DocBin, n_ents: int, output: Path) -> None:
    """Write the DocBin to `output` atomically and say what it holds (`n_ents` entities)."""
    from ..io.files import atomic_open

    with atomic_open(output) as f:
        f.write(doc_bin.to_bytes())
    typer.echo(f"{len(doc_bin)} documents, {n_ents} entities -> {output}")


@app.command("preprocess")
def preprocess(
    sources: list[Path] = typer.Argument(
        ..., help="PubTator file(s) (NCBI-disease, BC5CDR); several are concatenated", exists=True, dir_okay=False
    ),
    output: Path = typer.Argument(..., help="Where to write the DocBin (.spacy)"),
    label: str = typer.Option("Disease", help="Entity label of every mention ('' keeps the mention type)"),
    lang: str = typer.Option("en", help="Language whose tokenizer splits the text"),
) -> None:
    """Convert a PubTator corpus to a .spacy DocBin: gold entities with the concept ids as kb_id_, the PMID in
    user_data. The file is written atomically."""
    import spacy
    from spacy.tokens import DocBin

    from ..errors import ConceptNormError, Errors
    from ..io.corpus import pubtator_to_docs

    nlp, doc_bin, n_ents = spacy.blank(lang), DocBin(store_user_data=True), 0
    for source in sources:
        n_docs = len(doc_bin)
        for doc in pubtator_to_docs(nlp, source, label=label or None):
            doc_bin.add(doc)
            n_ents += len(doc.ents)
        if len(doc_bin) == n_docs:
            raise ConceptNormError(Errors.E603.format(path=source))
    write_doc_bin(doc_bin, n_ents, output)


@app.command("preprocess-notes")
def preprocess_notes(
    sources: list[Path] = typer.Argument(
        ..., help="Annotated notes, JSONL as evaluate-assertion reads it; several are concatenated", exists=True
    ),
    output: Path = typer.Argument(..., help="Where to write the DocBin (.spacy)"),
    label: str = typer.Option("Disease", help="Entity label of every annotated span"),
    lang: str = typer.Option("en", help="Language whose tokenizer splits the text"),
) -> None:
    """Convert annotated clinical notes (docs/clinical_notes/whole) to a .spacy DocBin whose entities are the
    annotated conditions, whatever their status: training data for the clinical recognizer. The file is written
    atomically."""
    import spacy
    from spacy.tokens import DocBin

    from ..errors import ConceptNormError
    from ..training.clinical_notes import notes_to_docs

    nlp, doc_bin, n_ents = spacy.blank(lang), DocBin(), 0
    try:
        for source in sources:
            for doc in notes_to_docs(nlp, source, label=label):
                doc_bin.add(doc)
                n_ents += len(doc.ents)
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    write_doc_bin(doc_bin, n_ents, output)
