"""Pipelines: `assemble` one from a config, `clinical` a copy of one for clinical notes."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("assemble", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def assemble(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="Pipeline config, e.g. configs/pipeline.cfg", exists=True, dir_okay=False),
    output: Path = typer.Argument(..., help="Pipeline directory to write; an existing one is replaced whole"),
    clinical: bool = typer.Option(
        None,
        "--clinical/--no-clinical",
        help="A pipeline for clinical notes: clinical_context and the settings of docs/clinical.md (default: "
        "clinical_context alone, where medspaCy is installed)",
    ),
) -> None:
    """Assemble a pipeline from a config as `spacy assemble` does (sourced components, the initialize section),
    but write it beside OUTPUT and swap it in only once saved: a failed run leaves the previous pipeline intact.
    Override config values as `spacy assemble` does: --paths.ner training/ner/model-best. The assertion status
    (clinical_context, after linking) is added where the `assertion` extra and medspaCy are installed; --clinical
    also turns on the settings for clinical notes."""
    from spacy.cli._util import parse_config_overrides, show_validation_error
    from spacy.util import get_sourced_components, load_config, load_model_from_config

    from ..io.pipelines import save
    from ..pipeline.clinical_context import add_clinical_context
    from ..pipeline.clinical_settings import add_clinical_abbreviations, add_clinical_findings, clinical_overrides

    with show_validation_error(config, hint_fill=False):
        overrides = parse_config_overrides(ctx.args)
        cfg = load_config(config, overrides=overrides, interpolate=False)
        if clinical:
            cfg = load_config(
                config, overrides={**overrides, **clinical_overrides(cfg["components"])}, interpolate=False
            )
        nlp = load_model_from_config(cfg, auto_fill=True)
    if clinical:
        add_clinical_abbreviations(nlp)
        add_clinical_findings(nlp)
    if clinical is not False:
        add_clinical_context(nlp, required=bool(clinical))
    nlp._link_components()  # as spacy assemble: listeners are linked before initializing
    with nlp.select_pipes(disable=[*get_sourced_components(cfg.interpolate())]):
        nlp.initialize()
    save(nlp, output)
    typer.echo(f"{' -> '.join(nlp.pipe_names)} -> {output}")


@app.command("clinical")
def clinical(
    model: str = typer.Argument(..., help="Pipeline directory or package, e.g. training/pipeline"),
    output: Path = typer.Argument(..., help="Pipeline directory to write; an existing one is replaced whole"),
    ner: str = typer.Option(
        None,
        help="A pipeline whose recognizer was trained on clinical notes (configs/ner_clinical_trf.cfg, e.g. "
        "training/ner_clinical/model-last): it replaces MODEL's",
    ),
    min_confidence: float = typer.Option(
        None,
        help="With --ner: the link_filter's min_confidence for its entities [default: "
        "CLINICAL_RECOGNIZER_MIN_CONFIDENCE of pipeline/clinical_settings.py]",
    ),
) -> None:
    """Save a copy of a pipeline for clinical notes: clinical_abbreviations and the settings for clinical notes
    (docs/clinical.md), a recognizer trained on clinical notes with --ner, and clinical_context last where
    medspaCy is installed."""
    from ..errors import ConceptNormError
    from ..io.pipelines import load, save
    from ..pipeline.clinical_context import add_clinical_context
    from ..pipeline.clinical_settings import CLINICAL_RECOGNIZER_MIN_CONFIDENCE, use_clinical_settings, use_recognizer

    try:
        nlp = load(model)
        if ner is not None:
            threshold = CLINICAL_RECOGNIZER_MIN_CONFIDENCE if min_confidence is None else min_confidence
            use_recognizer(nlp, load(ner), threshold)
        use_clinical_settings(nlp)
        has_context = add_clinical_context(nlp)
        save(nlp, output)
    except (ConceptNormError, OSError) as e:  # OSError: spaCy's E050, no pipeline there
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    missing = "" if has_context else " (no clinical_context: medspaCy is not installed)"
    typer.echo(f"{' -> '.join(nlp.pipe_names)} -> {output}{missing}")
