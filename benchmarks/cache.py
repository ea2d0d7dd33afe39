"""The concept_normalizer's cache of linked mention texts on the `annotate` benchmark's documents.

    python -m benchmarks.cache PIPELINE --data ../shared/data [--repeat 100] [--batch-size 64]
        [--abstracts NCBItestset_corpus.txt]

The input of `benchmarks.annotate` (the 100 NCBI-disease test abstracts `--repeat` times: 10,000 documents by
default) is annotated by `spacy_conceptnorm.annotate.annotate` (what the `annotate` command runs, one process)
twice, each time in a fresh pipeline: with the configured cache (`cache_size`, default 100,000 texts) and with
`cache_size` 0. Prints, for each, documents/second (pipeline loading excluded) and the cache's lookups (distinct
normalized texts per batch), hits and hit rate, and whether both runs wrote the same records. The pipeline needs
an entity recognizer (or ruler) before the concept_normalizer.

The benchmark's 10,000 documents are 100 abstracts 100 times over, so from the second copy on every text is a
hit: `--abstracts NCBItrainset_corpus.txt --repeat 1` gives the rate over 593 distinct abstracts instead.
"""

from __future__ import annotations

import filecmp
import json
import os
import tempfile
import time
from pathlib import Path

import spacy
import typer

from spacy_conceptnorm.annotate import annotate
from spacy_conceptnorm.io.files import atomic_open

from .annotate import write_input

app = typer.Typer(add_completion=False)


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Saved pipeline with a recognizer and a concept_normalizer"),
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/"),
    repeat: int = typer.Option(100, help="Copies of the 100 test abstracts"),
    batch_size: int = typer.Option(64, "--batch-size", help="Documents per nlp.pipe batch"),
    abstracts: str = typer.Option("NCBItestset_corpus.txt", help="The PubTator file of ncbi-disease/ to read"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    figures: dict = {"cpus": os.cpu_count(), "batch_size": batch_size, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "input.jsonl"
        figures["documents"] = write_input(data / "ncbi-disease" / abstracts, source, repeat)
        figures["abstracts"] = abstracts
        outputs = {}
        for label, size in (("cache on", None), ("cache off", 0)):
            config = {} if size is None else {"components": {"concept_normalizer": {"cache_size": size}}}
            nlp = spacy.load(pipeline, config=config)
            normalizer = nlp.get_pipe("concept_normalizer")
            outputs[label] = Path(tmp) / f"{size}.jsonl"
            load = os.getloadavg()[0]
            start = time.perf_counter()
            summary = annotate(nlp, source, outputs[label], batch_size=batch_size, progress=False)
            seconds = time.perf_counter() - start
            info = normalizer.cache_info()
            run = {
                "cache_size": normalizer.cache_size,
                "entities": summary.entities,
                "seconds": round(seconds, 1),
                "docs_per_second": round(summary.written / seconds, 1),
                "lookups": info["lookups"],
                "hits": info["hits"],
                "hit_rate": round(info["hits"] / info["lookups"], 4) if info["lookups"] else None,
                "cached_texts": info["size"],
                "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
            }
            figures["runs"][label] = run
            typer.echo(f"{label}: {json.dumps(run)}")
        figures["same_records"] = filecmp.cmp(outputs["cache on"], outputs["cache off"], shallow=False)
    typer.echo(f"{figures['documents']} documents; the same records with and without the cache: "
               f"{figures['same_records']}")  # fmt: skip
    if output:
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))


if __name__ == "__main__":
    app()
