"""Command line: `python -m spacy_conceptnorm <command>` (also installed as `spacy-conceptnorm`)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Link biomedical entities to ontology concepts.")


@app.callback()
def _commands() -> None:
    """Link biomedical entities to ontology concepts."""


@app.command("build-kb")
def build_kb(
    source: Path = typer.Argument(..., help="Ontology file: CTD TSV, MEDIC/ID||name, JSONL, OBO or MRCONSO.RRF"),
    output: Path = typer.Argument(..., help="Where to write the knowledge base (.kb)"),
    format: str = typer.Option("auto", help="auto, ctd, medic, id_name, jsonl, obo, mrconso"),
) -> None:
    """Build a knowledge base from an ontology file and save it."""
    from .kb import load_kb

    kb = load_kb(source, format=format)
    kb.to_disk(output)
    typer.echo(f"{len(kb)} concepts, {len(kb.names())} names -> {output}")


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="Training config, e.g. configs/train_xu_bethard.cfg"),
    output: Path = typer.Option(..., "--output", "-o", help="Output directory (model-best/, model-last/, ...)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUTPUT/checkpoint"),
) -> None:
    """Train the name encoder. Override config values as `spacy train` does: --training.batch_size 128."""
    from spacy.cli._util import parse_config_overrides

    from .training.trainer import train as run_training

    run_training(config, output, parse_config_overrides(ctx.args), resume=resume)


def main() -> None:
    app()
