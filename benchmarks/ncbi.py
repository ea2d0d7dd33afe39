"""NCBI-disease gold-mention linking benchmark: accuracy per search strategy, speed, KB build and load costs.

    python -m benchmarks.ncbi --data ../shared/data [--encoder DIR] [--all-strategies]

Links the gold mentions of the test set against MEDIC (2012), with the train+dev mentions as domain synonyms,
and prints Acc@1/Acc@5 (full and refined test set) per strategy, mentions/second through `nlp.pipe` with the KB
already encoded, the KB build and encoding times, and the saved pipeline's load time and resident memory.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import spacy
import torch
import typer
from spacy.tokens import Doc
from wasabi import MarkdownRenderer

from spacy_conceptnorm.evaluation.gold import link_gold_mentions, mention_accuracy, strip_links
from spacy_conceptnorm.io.corpus import mention_spans, pubtator_to_docs
from spacy_conceptnorm.kb.knowledge_base import load_kb

REPORTED = ["O-T", "O-C", "OD-T", "OD-C", "D-T+OD-T"]
app = typer.Typer(add_completion=False)


def evaluate(nlp, gold_docs: list[Doc], refined_out: set[str]) -> dict[str, float]:
    return mention_accuracy(nlp, link_gold_mentions(nlp, gold_docs), refined_out)


def measure_load(path: Path) -> dict[str, float]:
    """Load time and peak resident memory of a saved pipeline, in a fresh process."""
    code = (
        f"import time, resource, spacy; t = time.perf_counter(); nlp = spacy.load({str(path)!r}); "
        "nlp('warm up'); print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {"load_seconds": float(out[-2]), "load_peak_rss_mib": float(out[-1]) / 1024}


@app.command()
def main(
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/ and medic/"),
    encoder: str = typer.Option(None, help="Encoder model directory or id (default: packaged all-MiniLM-L6-v2)"),
    all_strategies: bool = typer.Option(False, help="Report all 14 strategies of Xu & Bethard's Table 4"),
    dev: bool = typer.Option(False, help="Evaluate on dev (domain synonyms from train only) instead of test"),
    threads: int = typer.Option(0, help="torch threads (0: torch's default)"),
    threshold: float = typer.Option(None, help="Sieve threshold (default: the component's, 0.95)"),
    pipeline: Path = typer.Option(
        None, help="Reuse the pipeline saved here by an earlier run with the same options, or save it here"
    ),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    from spacy_conceptnorm.search.sieve import ALL_STRATEGIES

    if threads:
        torch.set_num_threads(threads)
    ncbi = data / "ncbi-disease"
    nlp = spacy.blank("en")
    t = time.perf_counter()
    kb = load_kb(data / "medic" / "medic_06Jul2012.txt")
    kb_load = time.perf_counter() - t
    splits = {s: list(pubtator_to_docs(nlp, ncbi / f"NCBI{s}set_corpus.txt")) for s in ("train", "develop", "test")}
    domain_docs = splits["train"] if dev else splits["train"] + splits["develop"]
    eval_docs = splits["develop"] if dev else splits["test"]
    refined_out = {kb.normalizer(e.text) for e in mention_spans(domain_docs)}

    from spacy.training import Example

    kb_encode = None
    if pipeline and pipeline.exists():
        nlp = spacy.load(pipeline)
    else:
        nlp.add_pipe("abbreviation_resolver")
        nlp.add_pipe("composite_splitter")
        nlp.add_pipe("concept_normalizer", config={"encoder": {"model": encoder}})
        t = time.perf_counter()
        nlp.get_pipe("concept_normalizer").initialize(lambda: [Example(d, d) for d in domain_docs], nlp=nlp, kb=kb)
        kb_encode = time.perf_counter() - t
        if pipeline:
            nlp.to_disk(pipeline)
    normalizer = nlp.get_pipe("concept_normalizer")
    if threshold is not None:
        normalizer.set_strategy(normalizer.cfg["strategy"], threshold)
    text_components = ["abbreviation_resolver", "composite_splitter"]

    strategies = ALL_STRATEGIES if all_strategies else REPORTED
    rows = {}
    with nlp.select_pipes(disable=text_components):
        for strategy in strategies:
            normalizer.set_strategy(strategy)
            rows[strategy] = evaluate(nlp, eval_docs, refined_out)

    # the text components, with the default sieve
    normalizer.set_strategy("D-T+OD-T")
    ablation = {}
    for label, disabled in [
        ("neither", text_components),
        ("abbreviation_resolver", ["composite_splitter"]),
        ("composite_splitter", ["abbreviation_resolver"]),
        ("both", []),
    ]:
        with nlp.select_pipes(disable=disabled):
            ablation[label] = evaluate(nlp, eval_docs, refined_out)

    # speed: the default sieve, KB already encoded, fresh docs through nlp.pipe (tokenization not timed)
    with nlp.select_pipes(disable=text_components):
        list(nlp.pipe(strip_links(eval_docs[:5])))  # warm-up
        docs = strip_links(eval_docs)
        n_mentions = sum(len(d.ents) for d in docs)
        t = time.perf_counter()
        list(nlp.pipe(docs))
        pipe_seconds = time.perf_counter() - t
    component_docs_per_second = {}
    for name in text_components:
        docs = strip_links(eval_docs)
        t = time.perf_counter()
        list(nlp.get_pipe(name).pipe(docs))
        component_docs_per_second[name] = round(len(docs) / (time.perf_counter() - t), 1)

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        nlp.to_disk(tmp)
        save_seconds = time.perf_counter() - t
        size_mib = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()) / 2**20
        load = measure_load(Path(tmp))
        reloaded = spacy.load(tmp)
        same = [e.kb_id_ for d in reloaded.pipe(strip_links(eval_docs)) for e in d.ents] == [
            e.kb_id_ for d in nlp.pipe(strip_links(eval_docs)) for e in d.ents
        ]

    split = "dev" if dev else "test"
    first = rows[strategies[0]]
    print(
        f"\nNCBI-disease {split}: {first['mentions']} gold mentions ({first['refined_mentions']} in the refined set);"
        f" encoder {normalizer.encoder.reference}"
    )
    md = MarkdownRenderer()

    def pct(r: dict, keys: tuple[str, ...]) -> list[str]:
        return [f"{100 * r[k]:.2f}" for k in keys]

    keys, names = ("acc1", "acc5", "refined_acc1", "refined_acc5"), ["Acc@1", "Acc@5", "refined Acc@1", "refined Acc@5"]
    print(md.table([[s, *pct(r, keys)] for s, r in rows.items()], ["strategy", *names]))
    print("\nD-T+OD-T with the text components (gold mentions):")
    print(md.table([[label, *pct(r, keys[:3])] for label, r in ablation.items()], ["components", *names[:3]]))
    figures = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "kb_concepts": len(kb),
        "kb_names": len(kb.names()),
        "kb_load_seconds": round(kb_load, 2),
        "kb_encode_seconds": round(kb_encode, 2) if kb_encode is not None else "reused --pipeline",
        "pipe_mentions": n_mentions,
        "pipe_seconds": round(pipe_seconds, 3),
        "mentions_per_second": round(n_mentions / pipe_seconds, 1),
        **{f"{name}_docs_per_second": v for name, v in component_docs_per_second.items()},
        "save_seconds": round(save_seconds, 2),
        "saved_size_mib": round(size_mib, 1),
        **{k: round(v, 2) for k, v in load.items()},
        "reloaded_predictions_identical": same,
        "peak_rss_mib_this_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    for key, value in figures.items():
        print(f"{key}: {value}")
    if output:
        output.write_text(json.dumps({"strategies": rows, "text_components": ablation, **figures}, indent=2))


if __name__ == "__main__":
    app()
