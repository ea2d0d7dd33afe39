"""Requests/second of the curation server's list endpoint on a 10,000-document `annotate` output.

    python -m benchmarks.serve [PIPELINE] --data ../shared/data [--repeat 100] [--requests 300]

The 100 NCBI-disease test abstracts are annotated once by PIPELINE and the output's records written `--repeat`
times with distinct ids (PMID-r): a synthetic 10,000-document output in the real record format (annotating the
copies again would give the same records). Without PIPELINE, an entity_ruler of the corpus's gold mention texts
and a concept_normalizer over `--kb` (default: MEDIC of the data folder) annotate; `--encoder trigram` gives the
linker a hashed character-trigram encoder that encodes MEDIC in seconds instead of the packaged MiniLM (the
server-side figures hardly depend on it: the candidates of a page's mention texts are linked once and kept).

The server runs under uvicorn in a forked process on 127.0.0.1; one client (httpx, keep-alive) sends sequential GET
/api/mentions requests of 50 rows: the first page again and again, pages 1-20 in turn (after one pass that links
their candidates), filtered lists (a concept, a label, unreviewed), and "decide then list" (a decision clears the
cached filtered lists, so the next one filters every mention again), and the first NIL-cluster view (CODER++
clustering of the distinct NIL texts). Prints the figures; `--output` writes them as JSON.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import socket
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import spacy
import srsly
import typer

from spacy_conceptnorm.annotate import annotate, read_pubtator
from spacy_conceptnorm.io.corpus import read_pubtator as read_gold
from spacy_conceptnorm.io.files import atomic_open
from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase, load_kb
from spacy_conceptnorm.serve import load_curation

app = typer.Typer(add_completion=False)
PAGE = 50


class TrigramEncoder:
    """Hashed character trigrams, unit-normalized: a linker that encodes in microseconds (speed runs only)."""

    reference = "hashed-trigrams"
    device = "cpu"
    dim = 256

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            padded = f"  {text} "
            for j in range(len(padded) - 2):
                out[i, zlib.crc32(padded[j : j + 3].encode()) % self.dim] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True).clip(min=1e-12)

    def config(self) -> dict:
        return {"model": self.reference}


def ruler_pipeline(source: Path, kb_path: Path, encoder: str, nil_threshold: float) -> spacy.language.Language:
    """entity_ruler (the gold mention texts of `source`) + concept_normalizer over the KB."""
    nlp = spacy.blank("en")
    patterns = sorted({a.text for doc in read_gold(source) for a in doc.annotations})
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in patterns])
    normalizer = nlp.add_pipe("concept_normalizer", config={"nil_threshold": nil_threshold})
    if encoder == "trigram":
        normalizer.encoder = TrigramEncoder()
    kb = KnowledgeBase.from_disk(kb_path) if kb_path.suffix == ".kb" else load_kb(kb_path)
    normalizer.initialize(nlp=nlp, kb=kb, progress=True)
    return nlp


def repeat_output(annotated: Path, path: Path, repeat: int) -> tuple[int, int]:
    """The records of `annotated`, `repeat` times with ids ID-r; returns (documents, entities)."""
    records = list(srsly.read_jsonl(annotated))
    with open(path, "w", encoding="utf-8") as f:
        for r in range(repeat):
            f.writelines(srsly.json_dumps({**rec, "id": f"{rec['id']}-{r}"}) + "\n" for rec in records)
    return len(records) * repeat, sum(len(rec["entities"]) for rec in records) * repeat


def rate(get: Callable[[int], object], n: int) -> float:
    """Requests per second of n sequential calls get(0..n-1)."""
    start = time.perf_counter()
    for i in range(n):
        get(i)
    return round(n / (time.perf_counter() - start), 1)


def wait_for(client: httpx.Client, process: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.is_alive():
        try:
            client.get("/api/info").raise_for_status()
            return
        except httpx.TransportError:
            time.sleep(0.1)
    sys.exit("the server did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@app.command()
def main(
    pipeline: Path = typer.Argument(None, help="Saved pipeline with ner + concept_normalizer (default: a ruler)"),
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/ and medic/"),
    kb: Path = typer.Option(None, help="KB of the ruler pipeline (default DATA/medic/medic_06Jul2012.txt)"),
    encoder: str = typer.Option("minilm", help="Encoder of the ruler pipeline: minilm (packaged) or trigram"),
    nil_threshold: float = typer.Option(0.9, help="NIL under this confidence (the ruler pipeline is uncalibrated)"),
    repeat: int = typer.Option(100, help="Copies of the annotated 100 test abstracts"),
    requests: int = typer.Option(300, help="Requests per measurement"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    import uvicorn

    from spacy_conceptnorm.serve.app import create_app

    source = data / "ncbi-disease" / "NCBItestset_corpus.txt"
    start = time.perf_counter()
    if pipeline is None:
        nlp = ruler_pipeline(source, kb or data / "medic" / "medic_06Jul2012.txt", encoder, nil_threshold)
        described = f"entity_ruler (gold mention texts) + concept_normalizer ({encoder} encoder)"
    else:
        nlp, described = spacy.load(pipeline), str(pipeline)
    build_seconds = time.perf_counter() - start

    def fail(file: Path, line: int, problem: str) -> None:
        raise ValueError(f"{file}:{line}: {problem}")

    with tempfile.TemporaryDirectory() as tmp:
        source_jsonl, once, out = Path(tmp) / "in.jsonl", Path(tmp) / "once.jsonl", Path(tmp) / "out.jsonl"
        abstracts = [(pmid, text) for _, pmid, text in read_pubtator(source, fail)]
        source_jsonl.write_text("".join(srsly.json_dumps({"id": i, "text": t}) + "\n" for i, t in abstracts))
        annotate(nlp, source_jsonl, once, include_text=True, progress=False)
        documents, entities = repeat_output(once, out, repeat)
        nlp.get_pipe("concept_normalizer").linker.changed()  # empty its cache of linked texts, as after spacy.load
        start = time.perf_counter()
        curation = load_curation(nlp, out)
        load_seconds = time.perf_counter() - start
        concept = Counter(m.concept_id for m in curation.mentions).most_common(1)[0][0]

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(curation), host="127.0.0.1", port=port, log_level="error"))
        process = multiprocessing.get_context("fork").Process(target=server.run, daemon=True)
        process.start()  # the server in its own process (the session loaded above), the client here
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                wait_for(client, process)

                def get(**params: object) -> dict:
                    response = client.get("/api/mentions", params={"limit": PAGE, **params})
                    response.raise_for_status()
                    return response.json()

                start = time.perf_counter()
                total = get()["total"]
                cold = time.perf_counter() - start
                for page in range(20):  # link the candidates of pages 1-20 once
                    get(offset=page * PAGE)
                filters = [{"concept": concept}, {"label": "Disease"}, {"status": "unreviewed"}]
                for params in filters:
                    get(**params)

                start = time.perf_counter()
                nil = client.get("/api/nil-clusters").json()
                nil_seconds = time.perf_counter() - start

                def decide_then_list(i: int) -> None:
                    client.post(f"/api/mentions/{i}/decision", json={"action": "accept"}).raise_for_status()
                    get()

                figures = {
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                    "pipeline": described,
                    "documents": documents,
                    "mentions": total,
                    "entities_in_output": entities,
                    "pipeline_build_seconds": round(build_seconds, 1),
                    "load_seconds": round(load_seconds, 2),
                    "first_request_seconds": round(cold, 3),
                    "first_page_rps": rate(lambda i: get(), requests),
                    "pages_1_20_rps": rate(lambda i: get(offset=(i % 20) * PAGE), requests),
                    "filtered_rps": rate(lambda i: get(**filters[i % len(filters)]), requests),
                    "decide_then_list_per_s": rate(decide_then_list, min(requests, 100)),
                    "nil_mentions": nil["mentions"],
                    "nil_clusters": nil["total"],
                    "nil_clusters_first_seconds": round(nil_seconds, 2),
                }
        finally:
            process.terminate()
            process.join(10)
    for key, value in figures.items():
        print(f"{key}: {value}")
    if output:
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))


if __name__ == "__main__":
    app()
