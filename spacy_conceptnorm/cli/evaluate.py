"""Evaluation: `evaluate` a pipeline on gold corpora, `evaluate-assertion` on annotated clinical text."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


@app.command("evaluate")
def evaluate(
    model: Path = typer.Argument(..., help="Saved pipeline directory (ner optional, concept_normalizer)"),
    test: Path = typer.Option(..., "--test", help="Gold test data: .spacy DocBin or PubTator file"),
    train: Path = typer.Option(..., "--train", help="Gold train data: its mentions define the refined test set"),
    dev: Path = typer.Option(None, "--dev", help="Gold dev data for the NIL calibration (omit to skip NIL)"),
    output: Path = typer.Option(Path("metrics"), "--output", "-o", help="Directory for the JSON, PNG and report.md"),
    strategies: bool = typer.Option(True, "--strategies/--no-strategies", help="Also score all 14 search strategies"),
    holdout: float = typer.Option(0.2, help="Part of the mentions whose concepts are held out for NIL"),
    seed: int = typer.Option(0, help="Seed of the NIL hold-out"),
    hold_outs: int = typer.Option(8, "--hold-outs", min=1, help="Test NIL hold-outs also averaged (seeds SEED on)"),
) -> None:
    """Evaluate a pipeline: gold-mention Acc@1/Acc@5, end-to-end P/R/F1, NIL thresholds; write metrics/."""
    from ..evaluation.calibrate import load_pipeline
    from ..evaluation.gold import read_gold_docs
    from ..evaluation.linking import evaluate_pipeline
    from ..evaluation.report import write_report

    nlp = load_pipeline(model)
    test_docs, train_docs = read_gold_docs(nlp, test), read_gold_docs(nlp, train)
    dev_docs = read_gold_docs(nlp, dev) if dev is not None else None
    metrics = evaluate_pipeline(
        nlp, test_docs, train_docs, dev_docs, strategies=strategies, holdout=holdout, seed=seed, hold_outs=hold_outs
    )
    report = write_report(metrics, output)
    typer.echo(report.read_text().split("\n![")[0])
    typer.echo(f"-> {report}")


@app.command("evaluate-assertion")
def evaluate_assertion(
    model: str = typer.Argument(..., help="Pipeline directory or package (clinical_context is added if it has none)"),
    data: Path = typer.Argument(..., help='JSONL, a span a line: {"text", "start", "end", "status"[, "id"]}'),
    output: Path = typer.Option(None, "--output", help="Also write the report here (JSON)"),
    clinical_recall: bool = typer.Option(False, help="Turn on the settings for clinical notes (docs/clinical.md)"),
) -> None:
    """Assertion status on your annotated clinical text: per status precision/recall (on the annotated spans), how
    many of the spans the pipeline recognized and linked, and the precision and status of the entities it found."""
    from ..errors import ConceptNormError
    from ..evaluation.assertion import evaluate_assertions, read_annotated_spans
    from ..io.files import write_json
    from ..io.pipelines import load
    from ..pipeline.clinical_settings import use_clinical_settings

    try:
        nlp = load(model)
        if clinical_recall:
            use_clinical_settings(nlp)
        report = evaluate_assertions(nlp, read_annotated_spans(data))
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{report['spans']} spans in {report['texts']} texts: accuracy {100 * report['accuracy']:.2f}")
    for status, r in report["statuses"].items():
        typer.echo(f"  {status:<12} n={r['support']:<5} P {100 * r['precision']:6.2f}  R {100 * r['recall']:6.2f}")
    rec, n = report["recognition"], report["spans"]
    found = f"recognized {rec['recognized']} of {n} ({100 * rec['recognized'] / n:.1f}%, {rec['exact']} exact)"
    typer.echo(f"{found}, linked {rec['linked']}")
    if m := rec["with_concept_id"]:
        found = f"recognized {rec['recognized_with_concept_id']} ({100 * rec['recognized_with_concept_id'] / m:.1f}%)"
        typer.echo(f"of the {m} spans with a concept id: {found}, linked right {rec['linked_right']} "
                   f"({100 * rec['linked_right'] / m:.1f}%)")  # fmt: skip
    if e := report["found"]["entities"]:
        c, right = report["found"]["conditions"], report["found"]["status_right"]
        typer.echo(f"of the {e} entities found: {c} on an annotated span (precision {100 * c / e:.1f}%), "
                   f"status right for {right} ({100 * right / max(c, 1):.1f}%)")  # fmt: skip
    if output:
        write_json(output, report)
        typer.echo(f"-> {output}")
