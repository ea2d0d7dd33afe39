"""Throughput and memory of the `annotate` command on NCBI-disease abstracts.

    python -m spacy_conceptnorm.benchmarks.annotate PIPELINE --data ../shared/data [--repeat 100] [--n-process 1]

Writes the 100 NCBI-disease test abstracts `--repeat` times (distinct ids: 10,000 documents by default) to a
temporary JSONL, runs `python -m spacy_conceptnorm annotate PIPELINE` on it in a subprocess, and prints documents,
entities, wall time (pipeline loading included), documents/second (overall, and as `annotate` counts them, loading
excluded) and the peak resident memory of the largest process of the run (annotate itself, or one of its
`--n-process` workers: RUSAGE_CHILDREN's ru_maxrss is a maximum, not a sum).
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import srsly
import typer

from ..annotate import read_pubtator
from ..util import atomic_open

app = typer.Typer(add_completion=False)


def write_input(source: Path, path: Path, repeat: int) -> int:
    """The abstracts of a PubTator file, `repeat` times with ids PMID-r, as JSONL; returns the document count."""

    def fail(file: Path, line: int, problem: str) -> None:
        raise ValueError(f"{file}:{line}: {problem}")

    abstracts = [(pmid, text) for _, pmid, text in read_pubtator(source, fail)]
    with open(path, "w", encoding="utf-8") as f:
        for r in range(repeat):
            f.writelines(srsly.json_dumps({"id": f"{pmid}-{r}", "text": text}) + "\n" for pmid, text in abstracts)
    return len(abstracts) * repeat


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Saved pipeline directory, e.g. ner + concept_normalizer"),
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/"),
    repeat: int = typer.Option(100, help="Copies of the 100 test abstracts"),
    n_process: int = typer.Option(1, "--n-process", help="Passed to annotate"),
    batch_size: int = typer.Option(64, "--batch-size", help="Passed to annotate"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source, annotated = Path(tmp) / "input.jsonl", Path(tmp) / "output.jsonl"
        n_docs = write_input(data / "ncbi-disease" / "NCBItestset_corpus.txt", source, repeat)
        command = [sys.executable, "-m", "spacy_conceptnorm", "annotate", str(pipeline), str(source), str(annotated)]
        command += ["--n-process", str(n_process), "--batch-size", str(batch_size)]
        start = time.perf_counter()
        run = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if run.returncode != 0:
            sys.exit(f"annotate failed ({run.returncode}):\n{run.stderr[-3000:]}")
        peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        ids, entities = set(), 0
        with open(annotated, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                ids.add(record["id"])
                entities += len(record["entities"])
    if len(ids) != n_docs:
        sys.exit(f"expected {n_docs} documents in the output, found {len(ids)}")
    summary = run.stdout.strip().splitlines()[-1]
    rate = re.search(r"([\d.]+) docs/s", summary)
    figures = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "n_process": n_process,
        "batch_size": batch_size,
        "documents": n_docs,
        "entities": entities,
        "wall_seconds": round(wall, 1),
        "docs_per_second": round(n_docs / wall, 1),
        "annotate_docs_per_second": float(rate[1]) if rate else None,
        "peak_rss_mib": round(peak_rss, 1),
    }
    print(f"annotate: {summary}")
    for key, value in figures.items():
        print(f"{key}: {value}")
    if output:
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))


if __name__ == "__main__":
    app()
