"""Throughput and memory of the `annotate` command on NCBI-disease abstracts, with either engine.

    python -m benchmarks.annotate PIPELINE --data ../shared/data [--repeat 100] [--n-process 1]
        [--engine ray [--concurrency N] [--shard-size 1000] [--address ADDR] [--kill-midway]]
        [--keep-output FILE] [--reference FILE]

Writes the 100 NCBI-disease test abstracts `--repeat` times (distinct ids: 10,000 documents by default) to a
temporary JSONL, runs `python -m spacy_conceptnorm annotate PIPELINE` on it in a subprocess, and prints documents,
entities, wall time (pipeline loading, and for Ray its start and the actors' loading, included), documents/second
(overall, and as `annotate` counts them: the local engine after loading, Ray from its start) and memory: for the
local engine the peak resident memory of the largest process of the run (annotate itself, or one of its
`--n-process` workers: RUSAGE_CHILDREN's ru_maxrss is a maximum, not a sum); for Ray the peak of the summed
resident memory of the driver and every process under it (Ray's own processes and its actors), sampled every 0.5 s.

`--kill-midway` (Ray): once the manifest lists half of the shards, the driver is killed with SIGKILL; the same
command is run again and resumes. `--reference FILE` compares the output with FILE (e.g. the local engine's output
kept with `--keep-output`): the same records, every document once, in the same order.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import srsly
import typer

from spacy_conceptnorm.annotate import read_pubtator
from spacy_conceptnorm.io.files import atomic_open

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


def tree_rss_mib(root: int) -> float:
    """The summed resident memory of a process and all its descendants (Linux /proc), MiB."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        grown = tree | {pid for pid, ppid in parents.items() if ppid in tree}
        grew, tree = len(grown) > len(tree), grown
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_annotate(command: list[str], manifest: Path | None = None, kill_at: int = 0) -> tuple[int, str, float]:
    """Run the command; return (exit code, stdout, peak tree RSS in MiB). With `manifest` and `kill_at`, the process
    is killed with SIGKILL once the manifest lists `kill_at` shards."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], tree_rss_mib(proc.pid))
            if manifest and kill_at and manifest.exists():
                try:
                    shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
                except (OSError, ValueError, KeyError):
                    continue
                if len(shards) >= kill_at:
                    print(f"kill -9 of the driver (pid {proc.pid}) with {len(shards)} shards finished")
                    os.kill(proc.pid, signal.SIGKILL)
                    return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode not in (0, -signal.SIGKILL):
        sys.exit(f"annotate failed ({proc.returncode}):\n{err[-3000:]}")
    return proc.returncode, out, peak[0]


def read_records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Saved pipeline directory, e.g. ner + concept_normalizer"),
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/"),
    repeat: int = typer.Option(100, help="Copies of the 100 test abstracts"),
    n_process: int = typer.Option(1, "--n-process", help="Passed to annotate (local engine)"),
    batch_size: int = typer.Option(64, "--batch-size", help="Passed to annotate"),
    engine: str = typer.Option("local", "--engine", help="local or ray"),
    concurrency: int = typer.Option(None, "--concurrency", help="ray: actors (default: the CPUs)"),
    shard_size: int = typer.Option(1000, "--shard-size", help="ray: documents per shard"),
    address: str = typer.Option(None, "--address", help="ray: the cluster (default: a local Ray instance)"),
    kill_midway: bool = typer.Option(False, "--kill-midway", help="ray: kill -9 the driver halfway, then resume"),
    keep_output: Path = typer.Option(None, "--keep-output", help="Copy the annotate output here"),
    reference: Path = typer.Option(None, "--reference", help="Compare the output with this annotate output"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    if kill_midway and engine != "ray":
        sys.exit("--kill-midway is for --engine ray")
    with tempfile.TemporaryDirectory() as tmp:
        source, annotated = Path(tmp) / "input.jsonl", Path(tmp) / "output.jsonl"
        n_docs = write_input(data / "ncbi-disease" / "NCBItestset_corpus.txt", source, repeat)
        command = [sys.executable, "-m", "spacy_conceptnorm", "annotate", str(pipeline), str(source), str(annotated)]
        command += ["--batch-size", str(batch_size), "--engine", engine]
        if engine == "ray":
            command += ["--shard-size", str(shard_size)]
            command += ["--concurrency", str(concurrency)] if concurrency else []
            command += ["--address", address] if address else []
        else:
            command += ["--n-process", str(n_process)]
        manifest = annotated.with_name(annotated.name + ".parts") / "manifest.json"
        n_shards = -(-n_docs // shard_size)
        start = time.perf_counter()
        killed, peak_killed = {}, 0.0
        if kill_midway:
            code, _, peak_killed = run_annotate(command, manifest, kill_at=max(1, n_shards // 2))
            if code != -signal.SIGKILL:
                sys.exit("the run ended before it could be killed midway: use more documents or smaller shards")
            shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
            killed = {"killed_after_seconds": round(time.perf_counter() - start, 1), "shards_finished": len(shards),
                      "output_bytes_after_kill": annotated.stat().st_size if annotated.exists() else 0}  # fmt: skip
        code, stdout, peak = run_annotate(command)
        wall = time.perf_counter() - start
        peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        records = read_records(annotated)
        if keep_output:
            shutil.copyfile(annotated, keep_output)
    ids = [record["id"] for record in records]
    entities = sum(len(record["entities"]) for record in records)
    if len(set(ids)) != n_docs or len(ids) != n_docs:
        sys.exit(f"expected {n_docs} documents once each in the output, found {len(ids)} ({len(set(ids))} distinct)")
    summary = stdout.strip().splitlines()[-1]
    rate = re.search(r"([\d.]+) docs/s", summary)
    figures = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "engine": engine,
        "n_process": n_process if engine == "local" else None,
        "batch_size": batch_size,
        "documents": n_docs,
        "entities": entities,
        "wall_seconds": round(wall, 1),
        "docs_per_second": round(n_docs / wall, 1),
        "annotate_docs_per_second": float(rate[1]) if rate else None,
        "peak_rss_mib": round(peak_rss, 1),
        "peak_tree_rss_mib": round(max(peak, peak_killed), 1),
        **killed,
    }
    if reference:
        expected = read_records(reference)
        figures["same_records_as_reference"] = records == expected
        figures["reference_documents"] = len(expected)
    print(f"annotate: {summary}")
    for key, value in figures.items():
        print(f"{key}: {value}")
    if output:
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))
    if reference and not figures["same_records_as_reference"]:
        sys.exit("the output differs from the reference")


if __name__ == "__main__":
    app()
