"""`serve`: the curation page over an annotate output (spacy_conceptnorm.serve)."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("serve")
def serve(
    model: str = typer.Argument(..., help="The pipeline that annotated (a directory or package for spacy.load)"),
    annotations: Path = typer.Option(..., "--annotations", help="The JSONL output of annotate (--include-text)"),
    reviews: Path = typer.Option(None, "--reviews", help="Reviews log to append to (default OUT.reviews.jsonl)"),
    synonyms: Path = typer.Option(None, "--synonyms", help="Synonyms file to rewrite (default OUT.synonyms.jsonl)"),
    documents: Path = typer.Option(None, "--documents", help="The annotate input, for texts OUT does not hold"),
    save_model: Path = typer.Option(None, "--save-model", help="Directory 'Save pipeline' writes (with synonyms)"),
    nil_clusters: str = typer.Option("coder", "--nil-clusters", help="NIL grouping: coder (CODER++) or text"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; other than loopback needs --token"),
    port: int = typer.Option(8000, "--port", help="Port"),
    token: str = typer.Option(None, "--token", envvar="CONCEPTNORM_TOKEN", help="Required on every API request"),
) -> None:
    """The curation page: review the links of an annotate output worst first, correct them, add synonyms."""
    from ..errors import ConceptNormError
    from ..serve import load_curation, run_server
    from ..serve.app import check_bind

    try:
        check_bind(host, token)
        curation = load_curation(model, annotations, reviews, synonyms, documents, save_model, nil_clusters)
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    info = curation.info()
    typer.echo(f"{info['mentions']} mentions of {info['documents']} documents; reviews -> {info['reviews']}")
    typer.echo(f"http://{host}:{port}/" + ("#token=TOKEN (your --token)" if token else ""))
    run_server(curation, host, port, token)
