"""Encoding a knowledge base's names with each runtime of the encoder, and how close the vectors are.

    python -m spacy_conceptnorm.benchmarks.encode --kb ../shared/data/medic/medic_06Jul2012.txt [--repeats 2]

Encodes every normalized name of the KB (MEDIC 2012: 72,996) with the packaged all-MiniLM-L6-v2 (or `--model`),
once per runtime and repeat, the runtimes taking turns so that a change in the machine's load falls on both:
torch in fp32, then ONNX Runtime (`runtime="onnx"`). Loading the weights (and exporting the ONNX graph, which is
cached) is done before the clock starts, on a few names, and timed apart. Prints seconds and names/second per run,
torch's threads, the load average before and after each run, and the cosine of every name's ONNX vector to its
torch fp32 vector (minimum, and how many are under 0.999).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import typer

from ..encoder import NameEncoder
from ..kb import load_kb
from ..util import atomic_open

app = typer.Typer(add_completion=False)
RUNTIMES = ("torch", "onnx")


@app.command()
def main(
    kb: Path = typer.Option(Path("../shared/data/medic/medic_06Jul2012.txt"), help="Knowledge base file", exists=True),
    model: str = typer.Option(None, help="Encoder model (default: the packaged all-MiniLM-L6-v2)"),
    repeats: int = typer.Option(2, min=1, help="Timed runs per runtime"),
    limit: int = typer.Option(0, min=0, help="Encode only the first N names (0: all)"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    names = load_kb(kb).names()
    names = names[:limit] if limit else names
    encoders = {runtime: NameEncoder(model, precision="fp32", runtime=runtime) for runtime in RUNTIMES}
    figures: dict = {"names": len(names), "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "runs": []}
    for runtime, encoder in encoders.items():
        start = time.perf_counter()
        encoder.encode(names[:8])
        figures[f"{runtime}_load_seconds"] = round(time.perf_counter() - start, 2)
    vectors = {}
    for repeat in range(repeats):
        for runtime, encoder in encoders.items():
            load_before = os.getloadavg()[0]
            start = time.perf_counter()
            vectors[runtime] = encoder.encode(names)
            seconds = time.perf_counter() - start
            run = {"runtime": runtime, "repeat": repeat, "seconds": round(seconds, 1),
                   "names_per_second": round(len(names) / seconds), "load_before": round(load_before, 2),
                   "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip
            figures["runs"].append(run)
            typer.echo(json.dumps(run))
    cosine = (vectors["onnx"].astype(np.float64) * vectors["torch"]).sum(axis=1)
    figures["cosine_min"] = float(cosine.min())
    figures["cosine_under_0.999"] = int((cosine < 0.999).sum())
    figures["worst_name"] = names[int(cosine.argmin())]
    typer.echo(f"{len(names)} names, torch threads {figures['threads']}, {os.cpu_count()} CPUs")
    typer.echo("| runtime | seconds (median) | names/s | load average during the runs | first use (load/export) s |")
    typer.echo("|---|---|---|---|---|")
    for runtime in RUNTIMES:
        runs = [r for r in figures["runs"] if r["runtime"] == runtime]
        seconds = statistics.median(r["seconds"] for r in runs)
        loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
        typer.echo(f"| {runtime} | {seconds:.1f} | {len(names) / seconds:.0f} | {min(loads):.1f}-{max(loads):.1f} | "
                   f"{figures[f'{runtime}_load_seconds']} |")  # fmt: skip
    typer.echo(f"cosine onnx vs torch fp32 over every name: min {figures['cosine_min']:.7f} "
               f"({figures['worst_name']!r}), {figures['cosine_under_0.999']} under 0.999")  # fmt: skip
    if output:
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))


if __name__ == "__main__":
    app()
