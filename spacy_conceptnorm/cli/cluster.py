"""`cluster`: group terms (unlinked mentions, a term list) into proposed concepts (CODER++)."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("cluster")
def cluster(
    terms: Path = typer.Argument(..., help="A term list (one a line), a KB file (load_kb formats) or annotate JSONL"),
    output: Path = typer.Argument(..., help="JSONL to write (atomically): one cluster a line, the largest first"),
    model: str = typer.Option(None, "--model", help="Encoder: transformers directory or id (default: packaged MiniLM)"),
    top_m: int = typer.Option(50, "--top-m", help="Neighbours searched per term"),
    threshold: float = typer.Option(0.88, "--threshold", help="Cosine at or above which a neighbour pair is clustered"),
    sweep: bool = typer.Option(False, "--sweep", help="Also write OUTPUT.sweep.json (and .sweep.png with gold)"),
    input_format: str = typer.Option("auto", "--input-format", help="auto, terms, kb or annotate (its NIL mentions)"),
    ambiguous: str = typer.Option("drop", help="KB names of several concepts: drop, or first (the first concept)"),
    index: str = typer.Option("auto", help="auto (exact; IVF beyond 200k terms), exact, flat, hnsw or ivf"),
) -> None:
    """Cluster terms (CODER++): top-m neighbours by cosine, pairs >= threshold, connected components. A KB gives
    gold clusters (its concept ids) and pairwise P/R/F1; an annotate output's NIL mentions become proposed concepts."""
    from ..clustering import cluster_file, load_encoder
    from ..errors import ConceptNormError

    try:
        summary = cluster_file(
            terms, output, load_encoder(model), top_m, threshold, sweep, input_format, ambiguous, index, progress=True
        )
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{summary['terms']} terms -> {summary['clusters']} clusters ({summary['predicted_pairs']} pairs >= "
               f"{threshold}, {summary['index']} search, {summary['seconds']} s) -> {output}")  # fmt: skip
    for reading in ("pairs", "clusters_eval"):
        if reading in summary:
            s = summary[reading]
            typer.echo(f"{reading}: P {s['precision']:.3f}  R {s['recall']:.3f}  F1 {s['f1']:.3f}")
    for key in ("sweep", "plot"):
        if key in summary:
            typer.echo(f"{key} -> {summary[key]}")
