"""Encoding speed of the encoder's runtimes and precisions, and how close their vectors are to torch fp32's.

    python -m benchmarks.encode --kb ../shared/data/medic/medic_06Jul2012.txt [--repeats 2]
    python -m benchmarks.encode --mentions ../shared/data/ncbi-disease/NCBIdevelopset_corpus.txt \
        --variants fp32,bf16,int8 --repeats 5

Encodes every normalized name of the KB (MEDIC 2012: 72,996) with `NameEncoder.encode`, or with `--mentions` (a
PubTator file or `.spacy` DocBin) the distinct lowercased gold mention texts with `encode_queries` (as the linker
encodes mentions), with the packaged all-MiniLM-L6-v2 (or `--model`), once per variant and repeat, the variants
taking turns so that a change in the machine's load falls on all: "fp32" (torch), "bf16" (torch autocast),
"int8" (torch dynamic quantization of the Linear layers, `torch.ao.quantization.quantize_dynamic`), "onnx" (ONNX
Runtime, fp32). Loading the weights (and exporting the ONNX graph, which is cached) is done before the clock
starts, on a few texts, and timed apart. Prints seconds and texts/second per run, torch's threads, the load average
before and after each run, and each variant's cosine to torch fp32 over every text (minimum, and how many are
under 0.999). The first variant is the reference; fp32 is added first when not given.
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

from spacy_conceptnorm.cli.benchmark_weight import machine
from spacy_conceptnorm.io.corpus import read_docs
from spacy_conceptnorm.io.files import write_json
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.ml.name_encoder import NameEncoder

app = typer.Typer(add_completion=False)
VARIANTS = ("fp32", "bf16", "int8", "onnx")


def variant_encoder(variant: str, model: str | None) -> NameEncoder:
    """A NameEncoder computing in `variant` (see the module docstring), its weights loaded."""
    if variant not in VARIANTS:
        raise typer.BadParameter(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant == "onnx":
        return NameEncoder(model, precision="fp32", runtime="onnx")
    encoder = NameEncoder(model, precision="bf16" if variant == "bf16" else "fp32")
    if variant == "int8":
        encoder.model = torch.ao.quantization.quantize_dynamic(encoder.model, {torch.nn.Linear}, dtype=torch.qint8)
    return encoder


@app.command()
def main(
    kb: Path = typer.Option(Path("../shared/data/medic/medic_06Jul2012.txt"), help="Knowledge base file", exists=True),
    mentions: Path = typer.Option(None, help="Encode these gold mentions (PubTator or .spacy) instead", exists=True),
    model: str = typer.Option(None, help="Encoder model (default: the packaged all-MiniLM-L6-v2)"),
    variants: str = typer.Option("fp32,onnx", help=f"Comma-separated, of {', '.join(VARIANTS)}"),
    repeats: int = typer.Option(2, min=1, help="Timed runs per variant"),
    limit: int = typer.Option(0, min=0, help="Encode only the first N texts (0: all)"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    if mentions:
        texts = sorted({ent.text.lower() for doc in read_docs(mentions) for ent in doc.ents})
    else:
        texts = load_kb(kb).names()
    texts = texts[:limit] if limit else texts
    chosen = ["fp32", *[v for v in variants.split(",") if v and v != "fp32"]]
    figures: dict = {"texts": len(texts), "what": "mentions" if mentions else "names", "machine": machine(),
                     "threads": torch.get_num_threads(), "runs": []}  # fmt: skip
    encoders = {}
    for variant in chosen:
        start = time.perf_counter()
        encoders[variant] = variant_encoder(variant, model)
        encoders[variant].encode(texts[:8])
        figures[f"{variant}_load_seconds"] = round(time.perf_counter() - start, 2)
    encode = "encode_queries" if mentions else "encode"
    vectors = {}
    for repeat in range(repeats):
        for variant, encoder in encoders.items():
            load_before = os.getloadavg()[0]
            start = time.perf_counter()
            vectors[variant] = getattr(encoder, encode)(texts)
            seconds = time.perf_counter() - start
            run = {"variant": variant, "repeat": repeat, "seconds": round(seconds, 2),
                   "texts_per_second": round(len(texts) / seconds), "load_before": round(load_before, 2),
                   "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip
            figures["runs"].append(run)
            typer.echo(json.dumps(run))
    typer.echo(f"{len(texts)} {figures['what']} ({encode}), torch threads {figures['threads']}; {figures['machine']}")
    typer.echo(
        "| variant | seconds (median) | texts/s | load average | first use s | cosine to fp32: min | under 0.999 |"
    )
    typer.echo("|---|---|---|---|---|---|---|")
    for variant in chosen:
        runs = [r for r in figures["runs"] if r["variant"] == variant]
        seconds = statistics.median(r["seconds"] for r in runs)
        loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
        cosine = (vectors[variant].astype(np.float64) * vectors["fp32"]).sum(axis=1)
        figures[variant] = {
            "seconds": seconds,
            "cosine_min": float(cosine.min()),
            "cosine_under_0.999": int((cosine < 0.999).sum()),
            "worst": texts[int(cosine.argmin())],
        }
        typer.echo(
            f"| {variant} | {seconds:.2f} | {len(texts) / seconds:.0f} | {min(loads):.1f}-{max(loads):.1f} | "
            f"{figures[f'{variant}_load_seconds']} | {cosine.min():.5f} | {(cosine < 0.999).sum()} |"
        )
    if output:
        write_json(output, figures)


if __name__ == "__main__":
    app()
