"""Ablation of the second stage on NCBI-disease: one row per added piece, on dev and on test.

    python -m benchmarks.ranking training/assembled --train corpus/train.spacy \\
        --dev corpus/dev.spacy --test corpus/test.spacy [--scorers cnn,cross_encoder] [--output FILE]

PIPELINE is an assembled pipeline whose domain names are the train+dev mentions (`spacy project run assemble`).
Rows: the sieve alone; + the hybrid ranker (dense + learned weight x TF-IDF); + the concept prior (the shipped
`hybrid_prior`); + each pair scorer named in --scorers (Mondal's CNN, the cross-encoder), added in turn; then
document consistency. Each ranker is trained by `train_ranker` as the workflow does. Dev is scored with the dev
mentions that are not train mentions taken out of the domain names; the ranking is read with NIL off (the NIL
threshold is `calibrate`'s business). mentions/s: the test gold mentions through `nlp.pipe`, text components
off, KB encoded, the linker's cache emptied first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from spacy_conceptnorm.evaluation.calibrate import dev_mentions_hidden, load_pipeline
from spacy_conceptnorm.evaluation.gold import (
    get_normalizer,
    link_gold_mentions,
    mention_accuracy,
    read_gold_docs,
    recognizers,
    strip_links,
)
from spacy_conceptnorm.io.corpus import mention_spans
from spacy_conceptnorm.linking.linker import Linker
from spacy_conceptnorm.linking.ranker import Ranker
from spacy_conceptnorm.training.ranking import train_ranker

app = typer.Typer(add_completion=False)


def _scorer(name: str):
    if name == "cnn":
        from spacy_conceptnorm.linking.cnn_ranker import make_cnn_ranker

        return make_cnn_ranker()
    if name == "cross_encoder":
        from spacy_conceptnorm.linking.cross_encoder import make_cross_encoder_ranker

        return make_cross_encoder_ranker()
    raise typer.BadParameter(f"unknown scorer {name!r}: cnn or cross_encoder")


def _use(normalizer, ranker: Ranker | None, lexical) -> None:
    """Swap the component's ranker (the fitted lexical index is kept)."""
    normalizer.ranker = ranker
    normalizer.linker = Linker(normalizer.searcher, ranker)
    if ranker is not None:
        normalizer.linker.candidate_generator(lexical)


def _speed(nlp, docs) -> float:
    normalizer = get_normalizer(nlp)[1]
    normalizer.linker.clear_cache()
    docs = strip_links(docs)
    n = sum(len(d.ents) for d in docs)
    off = [p for p in ("abbreviation_resolver", "composite_splitter") if p in nlp.pipe_names] + recognizers(nlp)
    with nlp.select_pipes(disable=off):
        t = time.perf_counter()
        list(nlp.pipe(docs))
    return n / (time.perf_counter() - t)


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Assembled pipeline (train+dev mentions as domain names)"),
    train: Path = typer.Option(..., help="Gold train data (.spacy or PubTator)"),
    dev: Path = typer.Option(..., help="Gold dev data"),
    test: Path = typer.Option(..., help="Gold test data"),
    scorers: str = typer.Option("", help="Pair scorers to add in turn, comma-separated: cnn,cross_encoder"),
    output: Path = typer.Option(None, help="Write the rows as JSON here"),
) -> None:
    nlp = load_pipeline(pipeline)
    normalizer = get_normalizer(nlp)[1]
    train_docs, dev_docs, test_docs = (read_gold_docs(nlp, p) for p in (train, dev, test))
    refined_out = {normalizer.kb.normalizer(e.text) for e in mention_spans(train_docs)}
    base = normalizer.linker if normalizer.ranker else Linker(normalizer.searcher, Ranker())
    lexical = base.candidate_generator().lexical

    def score(label: str, seconds: float | None) -> dict:
        with dev_mentions_hidden(nlp, dev_docs, train_docs):
            dev_acc = mention_accuracy(nlp, link_gold_mentions(nlp, dev_docs), refined_out)
        test_acc = mention_accuracy(nlp, link_gold_mentions(nlp, test_docs), refined_out)
        row = {"row": label, "dev": dev_acc, "test": test_acc, "train_seconds": seconds, "mentions_per_second": 0.0}
        row["mentions_per_second"] = round(_speed(nlp, test_docs), 1)
        typer.echo(
            f"| {label} | " + " | ".join(
                f"{100 * acc[k]:.2f}" for acc in (dev_acc, test_acc) for k in ("acc1", "acc5", "refined_acc1")
            ) + f" | {'' if seconds is None else f'{seconds:.0f}'} | {row['mentions_per_second']:.0f} |"
        )  # fmt: skip
        return row

    typer.echo(
        "| row | dev Acc@1 | dev Acc@5 | dev refined Acc@1 | test Acc@1 | test Acc@5 | test refined Acc@1 "
        "| train s | mentions/s |\n|---|---|---|---|---|---|---|---|---|"
    )
    consistency = normalizer.cfg["consistency"]
    normalizer.cfg["consistency"] = False
    rows = []
    _use(normalizer, None, lexical)
    rows.append(score("sieve alone", None))
    steps = [("+ hybrid ranker", "hybrid", []), ("+ concept prior (hybrid_prior)", "hybrid_prior", [])]
    added: list[str] = []
    for name in [s for s in scorers.split(",") if s]:
        added.append(name)
        steps.append((f"+ {name} scorer", "hybrid_prior", list(added)))
    for label, model, names in steps:
        ranker = Ranker(model, {n: _scorer(n) for n in names})
        _use(normalizer, ranker, lexical)
        t = time.perf_counter()
        train_ranker(nlp, train_docs, dev_docs, log=lambda _: None)
        rows.append(score(label, time.perf_counter() - t))
    normalizer.cfg["consistency"] = True
    rows.append(score("+ document consistency", None))
    normalizer.cfg["consistency"] = consistency
    if output:
        output.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    app()
