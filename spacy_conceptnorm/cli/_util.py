"""The command line's typer apps, on which the command modules register their commands, and its entry point."""

from __future__ import annotations

import typer

HELP = "Link biomedical entities to ontology concepts."
BENCHMARK_HELP = (
    "Measure a saved pipeline: linking speed against TF-IDF, documents/s against its transformer, load time and "
    "memory (docs/benchmarks.md)."
)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
benchmark_cli = typer.Typer(name="benchmark", help=BENCHMARK_HELP, no_args_is_help=True, add_completion=False)
app.add_typer(benchmark_cli)


@app.callback()
def _commands() -> None:
    """Link biomedical entities to ontology concepts."""


def main() -> None:
    """Run the command line (`python -m spacy_conceptnorm`, the `spacy-conceptnorm` script)."""
    app()
