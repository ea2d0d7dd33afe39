"""`annotate`: link the entities of a file of documents, resumably (spacy_conceptnorm.annotate)."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("annotate")
def annotate(
    model: str = typer.Argument(..., help="Saved pipeline directory (spacy.load), e.g. ner + concept_normalizer"),
    input: Path = typer.Argument(..., help="A .jsonl, PubTator or .txt file, or a directory of .txt files"),
    output: Path = typer.Argument(..., help="The .jsonl or .pubtator file to write; an existing one is resumed"),
    n_process: int = typer.Option(1, "--n-process", help="Processes for nlp.pipe"),
    batch_size: int = typer.Option(64, "--batch-size", help="Documents per batch (and per flushed write)"),
    input_format: str = typer.Option("auto", "--input-format", help="auto, jsonl, pubtator or txt"),
    output_format: str = typer.Option("auto", "--output-format", help="auto, jsonl or pubtator"),
    strict: bool = typer.Option(False, "--strict", help="Fail on a malformed input record instead of skipping it"),
    include_text: bool = typer.Option(False, "--include-text", help="Write each document's text to the JSONL"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar and no summary line"),
    engine: str = typer.Option("local", "--engine", help="local (nlp.pipe here) or ray (Ray Data actors)"),
    address: str = typer.Option(None, "--address", help="ray: the cluster to join (default RAY_ADDRESS, else local)"),
    concurrency: int = typer.Option(None, "--concurrency", help="ray: actors, one pipeline each (default: CPUs)"),
    num_gpus: float = typer.Option(0.0, "--num-gpus", help="ray: GPUs per actor (a fraction shares a GPU)"),
    shard_size: int = typer.Option(1000, "--shard-size", help="ray: documents per shard, the unit of resuming"),
) -> None:
    """Link the entities of every document of INPUT and append them to OUTPUT, skipping ids already there."""
    from ..annotate import annotate as run_annotate
    from ..annotate import annotate_ray, parts_dir
    from ..errors import ConceptNormError, Errors

    common = dict(batch_size=batch_size, input_format=input_format, output_format=output_format, strict=strict,
                  include_text=include_text, progress=not quiet)  # fmt: skip
    ray_options = {"--address": address, "--concurrency": concurrency, "--num-gpus": num_gpus or None,
                   "--shard-size": None if shard_size == 1000 else shard_size}  # fmt: skip
    try:
        if engine not in ("local", "ray"):
            raise ConceptNormError(Errors.E997.format(engine=engine))
        misplaced = [name for name, value in ray_options.items() if value is not None] if engine == "local" else []
        misplaced += ["--n-process"] if engine == "ray" and n_process != 1 else []
        if misplaced:
            raise ConceptNormError(Errors.E996.format(options=", ".join(misplaced), engine=engine))
        if engine == "ray":
            summary = annotate_ray(
                model, input, output, address=address, concurrency=concurrency, num_gpus=num_gpus,
                shard_size=shard_size, **common,
            )  # fmt: skip
        else:
            summary = run_annotate(model, input, output, n_process=n_process, **common)
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        kept = (
            f"{parts_dir(output)} holds every finished shard"
            if engine == "ray"
            else f"{output} holds every completed document"
        )
        typer.echo(f"Interrupted: {kept}; run again to resume.", err=True)
        raise typer.Exit(130) from None
    if not quiet:
        typer.echo(f"{summary} -> {output}")
