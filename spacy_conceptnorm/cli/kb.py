"""`build-kb`: a knowledge base from an ontology file."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("build-kb")
def build_kb(
    source: Path = typer.Argument(..., help="Ontology file: CTD TSV, MEDIC/ID||name, JSONL, OBO or MRCONSO.RRF"),
    output: Path = typer.Argument(..., help="Where to write the knowledge base (.kb)"),
    format: str = typer.Option("auto", help="auto, ctd, medic, id_name, jsonl, obo, mrconso"),
) -> None:
    """Build a knowledge base from an ontology file and save it."""
    from ..kb.knowledge_base import load_kb

    kb = load_kb(source, format=format)
    kb.to_disk(output)
    typer.echo(f"{len(kb)} concepts, {len(kb.names())} names -> {output}")
