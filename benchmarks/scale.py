"""A knowledge base of millions of names in bounded memory: a streamed MRCONSO build, then each index type.

    python -m benchmarks.scale [--names 5000000] [--dim 384] [--queries 1000]
        [--types exact,hnsw,ivf,ivfpq] [--workdir /tmp/conceptnorm-scale] [--limit 3600]

`--names` may list several sizes (`100000,1000000`); a type may carry settings (`ivfpq@ivf_nprobe=64`).

KB part: a synthetic `MRCONSO.RRF` of `--names` English rows (1 to 4 names per CUI, 2 to 5 words from a fixed
vocabulary of made-up words, about 2% of names shared with another CUI) is built into a KnowledgeBase by `load_kb`,
which streams the file, in a fresh process: build seconds, peak RSS, the bytes of the KB's tables, save and load
seconds.

Index part, SYNTHETIC VECTORS: the name vectors are random unit vectors (encoding millions of names would take
hours here), one per KB name, written as float16 and memory-mapped; the queries are `--queries` KB rows plus
Gaussian noise (cosine about 0.8 to their row). Each index type runs in a fresh process that loads the KB,
memory-maps the vectors and builds a SieveSearcher over them with that index type: build seconds, peak RSS (with
the part that is file-backed: pages of the memory-mapped vectors, which the kernel drops under pressure, and
anonymous memory, which it cannot), queries/s through the index (all queries in one batch, and one query at a time)
and through the whole sieve (both on fewer queries when they would take over `SINGLE_BUDGET` seconds), and
recall@1: the share of queries whose first row is the one exact search ranks first (`exact` runs first and gives
the reference). A type still running after `--limit` seconds is stopped and reported.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import typer

app = typer.Typer(add_completion=False)

NOISE_COSINE = 0.8  # a query's cosine to the KB row it was made from
SWEEPS = {  # wider searches measured on the index built with the defaults
    "hnsw": [("hnsw_ef_search", 512)],
    "ivf": [("ivf_nprobe", 64), ("ivf_nprobe", 256)],
    "ivfpq": [("ivf_nprobe", 16), ("ivf_nprobe", 256)],  # (64 by default)
}
SINGLE_BUDGET = 30.0  # seconds for the one-query-at-a-time and sieve timings (fewer queries where search is slow)
SYLLABLES = ["ab", "ac", "al", "an", "ar", "ba", "be", "ca", "ce", "ci", "co", "da", "de", "di", "do", "el", "en", "er",
             "fa", "fi", "ga", "ge", "gi", "go", "ha", "he", "hi", "ia", "ic", "id", "il", "in", "is", "it", "ka", "la",
             "le", "li", "lo", "lu", "ma", "me", "mi", "mo", "mu", "na", "ne", "ni", "no", "nu", "ol", "om", "on", "or",
             "os", "pa", "pe", "pi", "po", "ra", "re", "ri", "ro", "ru", "sa", "se", "si", "so", "ta", "te", "ti", "to",
             "tu", "ul", "um", "un", "ur", "us", "va", "ve", "vi", "xa", "yl", "za", "ze", "zo"]  # fmt: skip


def write_mrconso(path: Path, lines: int, seed: int = 0) -> None:
    """A synthetic MRCONSO.RRF of `lines` English rows, sorted by CUI, written in chunks."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array(["".join(rng.choice(SYLLABLES, rng.integers(2, 5))) for _ in range(20000)])
    tmp = path.with_suffix(".tmp")
    written, cui = 0, 0
    recent: list[str] = []
    with open(tmp, "w", encoding="utf8") as f:
        while written < lines:
            chunk = min(100_000, lines - written)
            words = vocabulary[rng.integers(0, len(vocabulary), size=(chunk, 5))]
            sizes = rng.integers(2, 6, size=chunk)
            per_cui = rng.integers(1, 5, size=chunk)
            shared = rng.random(chunk) < 0.02
            rows, i = [], 0
            while i < chunk:
                cui += 1
                for j in range(min(int(per_cui[i]), chunk - i)):
                    name = " ".join(words[i + j, : sizes[i + j]]).capitalize()
                    if shared[i + j] and recent:
                        name = recent[int(rng.integers(len(recent)))]
                    elif len(recent) < 1000:
                        recent.append(name)
                    else:
                        recent[int(rng.integers(1000))] = name
                    first = j == 0
                    ts, stt, pref = ("P", "PF", "Y") if first else ("S", "VO", "N")
                    rows.append(f"C{cui:07d}|ENG|{ts}|L{cui}|{stt}|S{i + j}|{pref}|A{written + i + j}||||SYN|PT|X{cui}|"
                                f"{name}|0|N||\n")  # fmt: skip
                i += max(1, min(int(per_cui[i]), chunk - i))
            f.writelines(rows)
            written += chunk
    tmp.rename(path)


def write_vectors(path: Path, rows: int, dim: int, seed: int = 1) -> None:
    """`rows` random unit vectors as a float16 `.npy`, written a block at a time."""
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False,
                  "shape": (rows, dim)}  # fmt: skip
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, rows, 65536):
            block = rng.standard_normal((min(65536, rows - start), dim), dtype=np.float32)
            block /= np.linalg.norm(block, axis=1, keepdims=True)
            f.write(block.astype(np.float16).tobytes())
    tmp.rename(path)


def make_queries(vectors, n: int, seed: int = 2) -> np.ndarray:
    """`n` rows of `vectors` (a VectorStore) plus Gaussian noise, renormalized: cosine about NOISE_COSINE."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(vectors), n, replace=False))
    dim = vectors.dim
    sigma = np.sqrt((1 / NOISE_COSINE**2 - 1) / dim)
    queries = vectors[rows] + rng.normal(0, sigma, size=(n, dim)).astype(np.float32)
    return (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)


class MemoryWatch:
    """Peaks of the process's resident memory, sampled from /proc/self/status: all of it, anonymous, file-backed."""

    def __init__(self, every: float = 0.1) -> None:
        self.peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def sample(self) -> None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in self.peaks:
                        self.peaks[key] = max(self.peaks[key], int(value.split()[0]) * 1024)
        except OSError:  # not Linux: ru_maxrss only
            pass

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.sample()

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.sample()
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return {"peak_rss": max(maxrss, self.peaks["VmRSS"]), "peak_anon": self.peaks["RssAnon"],
                "peak_file": self.peaks["RssFile"]}  # fmt: skip


def child_kb(mrconso: str, kb_path: str) -> dict:
    """Build (streamed from MRCONSO) and save: the build's peak memory, then the save's."""
    import spacy_conceptnorm  # noqa: F401 (the imports' memory counts as a baseline, as in the index runs)
    from spacy_conceptnorm.kb.knowledge_base import load_kb

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    watch = MemoryWatch()
    start = time.perf_counter()
    kb = load_kb(mrconso)
    build = time.perf_counter() - start
    built = watch.stop()
    names, concepts, nbytes = len(kb.name_ids()), len(kb), kb.nbytes()
    watch = MemoryWatch()
    start = time.perf_counter()
    kb.to_disk(kb_path)
    save = time.perf_counter() - start
    saved = watch.stop()
    return {"names": names, "concepts": concepts, "kb_bytes": nbytes, "build_s": build, "save_s": save,
            "baseline_rss": baseline, **built, "save_peak_rss": saved["peak_rss"]}  # fmt: skip


def child_kb_load(kb_path: str) -> dict:
    """Load a saved KB in a fresh process: seconds and peak memory."""
    import spacy_conceptnorm  # noqa: F401
    from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    watch = MemoryWatch()
    start = time.perf_counter()
    KnowledgeBase.from_disk(kb_path)
    return {"load_s": time.perf_counter() - start, "baseline_rss": baseline, **watch.stop()}


def child_index(kb_path: str, vectors: str, spec: str, queries: int, truth: str) -> dict:
    from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase
    from spacy_conceptnorm.search.sieve import SieveSearcher
    from spacy_conceptnorm.search.vector_store import VectorStore

    watch = MemoryWatch()
    kb = KnowledgeBase.from_disk(kb_path)
    store = VectorStore.load(vectors)
    query_vectors = make_queries(store, queries)
    index_type, _, settings = spec.partition("@")
    config = {"index_type": index_type, **{k: int(v) for k, v in (s.split("=") for s in settings.split(",") if s)}}
    searcher = SieveSearcher(kb, encoder=None, strategy="OD-T", top_k=5, index=config)
    start = time.perf_counter()
    searcher.build(vectors=store)
    build = time.perf_counter() - start
    index = searcher.indexes["ontology"]
    start = time.perf_counter()
    _, ids = index.search(query_vectors, 20)  # what the sieve asks for (4 x top_k)
    batch = time.perf_counter() - start
    start, single_n = time.perf_counter(), 0
    while single_n < min(100, queries) and (single_n < 3 or time.perf_counter() - start < SINGLE_BUDGET):
        index.search(query_vectors[single_n : single_n + 1], 20)
        single_n += 1
    single = time.perf_counter() - start
    sieve_n = min(queries, max(50, int(SINGLE_BUDGET * queries / batch)))  # a subset where search is slow
    keys = [f"query {q}" for q in range(sieve_n)]  # not KB names: the given vectors are searched
    start = time.perf_counter()
    searcher.search_keys(keys, vectors=query_vectors[:sieve_n])
    sieve = time.perf_counter() - start
    top1 = ids[:, 0]
    reference = np.load(truth) if index_type != "exact" and Path(truth).exists() else None
    sweep = []
    for setting, value in SWEEPS.get(index.index_type, ()):  # the same index searched wider: recall for speed
        index.set_search_breadth(**{setting: value})
        start = time.perf_counter()
        wider = index.search(query_vectors, 20)[1][:, 0]
        row = {"setting": setting, "value": value, "qps_batch": queries / (time.perf_counter() - start)}
        if reference is not None:
            row["recall_at_1"] = float((reference == wider).mean())
        sweep.append(row)
    result = {"index_type": index.index_type, "spec": spec, "rows": len(store), "build_s": build,
              "qps_batch": queries / batch, "ms_single": 1000 * single / single_n, "qps_sieve": sieve_n / sieve,
              "index_bytes": index.nbytes(), "sweep": sweep, **watch.stop()}  # fmt: skip
    if index_type == "exact":
        np.save(truth, top1)
        result["recall_at_1"] = 1.0
    elif reference is not None:
        result["recall_at_1"] = float((reference == top1).mean())
    return result


def real_vectors(pipeline: Path, dev: Path, specs: list[str]) -> list[dict]:
    """Recall@1 against exact search on real vectors: a saved pipeline's ontology names searched with the gold
    mentions of a dev DocBin (encoded by the pipeline's encoder), each index type built over the pipeline's store."""
    import spacy
    from spacy.tokens import DocBin

    from spacy_conceptnorm.kb.knowledge_base import ONTOLOGY
    from spacy_conceptnorm.search.index import VectorIndex

    nlp = spacy.load(pipeline)
    searcher = nlp.get_pipe("concept_normalizer").searcher
    docs = DocBin().from_disk(dev).get_docs(nlp.vocab)
    texts = sorted({searcher.kb.normalizer(ent.text) for doc in docs for ent in doc.ents} - {""})
    queries = searcher.query_vectors(texts)
    rows = searcher.name_rows[searcher.kb.name_ids(ONTOLOGY)]
    results, reference = [], None
    for spec in ["exact", *[s for s in specs if s.split("@")[0] != "exact"]]:
        index_type, _, settings = spec.partition("@")
        config = {k: int(v) for k, v in (s.split("=") for s in settings.split(",") if s)}
        index = VectorIndex.on_store(searcher.vectors, index_type=index_type, **config)
        start = time.perf_counter()
        index.add(rows)
        build = time.perf_counter() - start
        start = time.perf_counter()
        top1 = index.search(queries, 20)[1][:, 0]
        row = {"spec": spec, "rows": len(rows), "queries": len(queries), "build_s": build,
               "qps_batch": len(queries) / (time.perf_counter() - start)}  # fmt: skip
        reference = top1 if reference is None else reference
        row["recall_at_1"] = float((top1 == reference).mean())
        for setting, value in SWEEPS.get(index.index_type, ()):
            index.set_search_breadth(**{setting: value})
            wider = index.search(queries, 20)[1][:, 0]
            row[f"recall_at_1_{setting}_{value}"] = float((wider == reference).mean())
        results.append(row)
    return results


def run_child(args: list[str], limit: float) -> dict:
    """Run this module in a fresh process (its own peak memory); an error or a timeout is reported as such."""
    command = [sys.executable, "-m", "benchmarks.scale", "--child", json.dumps(args)]
    start = time.perf_counter()
    try:
        env = os.environ | {"HF_HUB_OFFLINE": "1"}
        out = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {limit:.0f} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1], "seconds": time.perf_counter() - start}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


@app.command()
def main(
    names: str = typer.Option("5000000", help="MRCONSO lines (comma-separated sizes run in turn)"),
    dim: int = typer.Option(384, help="vector dimension (all-MiniLM-L6-v2: 384)"),
    queries: int = typer.Option(1000, help="queries per index type"),
    types: str = typer.Option("exact,hnsw,ivf,ivfpq", help="index types (@setting=value,...); '' for none"),
    workdir: Path = typer.Option(Path("/tmp/conceptnorm-scale"), help="generated files are kept here"),
    limit: float = typer.Option(3600.0, help="seconds each run may take"),
    pipeline: Path = typer.Option(None, help="instead: real vectors, a saved pipeline's, queried with --dev mentions"),
    dev: Path = typer.Option(Path("corpus/dev.spacy"), help="DocBin of gold mentions for --pipeline"),
    child: str = typer.Option("", hidden=True),
) -> None:
    if pipeline is not None:
        rows = real_vectors(pipeline, dev, types.split(","))
        typer.echo(f"Real vectors: {pipeline} ({rows[0]['rows']:,} ontology names), {rows[0]['queries']} distinct "
                   f"gold mentions of {dev}")  # fmt: skip
        typer.echo("| index | build s | queries/s (batch) | recall@1 | wider search: recall@1 |\n|---|---|---|---|---|")
        for row in rows:
            wider = ", ".join(f"{k.removeprefix('recall_at_1_')}: {v:.3f}" for k, v in row.items() if k.startswith(
                "recall_at_1_"))  # fmt: skip
            typer.echo(f"| {row['spec']} | {row['build_s']:.1f} | {row['qps_batch']:.0f} | {row['recall_at_1']:.3f} "
                       f"| {wider} |")  # fmt: skip
        return
    if child:
        kind, *args = json.loads(child)
        children = {"kb": child_kb, "kb_load": child_kb_load, "index": child_index}
        typer.echo(json.dumps(children[kind](*args)))
        return
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results.jsonl"
    typer.echo("Synthetic data: random unit vectors, not encoded names (see the module docstring).")
    for size in [int(n) for n in names.split(",")]:
        mrconso = workdir / f"MRCONSO_{size}.RRF"
        if not mrconso.exists():
            start = time.perf_counter()
            write_mrconso(mrconso, size)
            typer.echo(f"wrote {mrconso} ({size:,} lines) in {time.perf_counter() - start:.0f} s")
        kb_path = workdir / f"kb_{size}.kb"
        kb = run_child(["kb", str(mrconso), str(kb_path)], limit)
        kb.update(part="kb", lines=size)
        if "error" in kb:
            typer.echo(f"KB from {size:,} MRCONSO lines: {kb['error']}")
            continue
        loaded = run_child(["kb_load", str(kb_path)], limit)
        typer.echo(f"\nKB from {size:,} MRCONSO lines (streamed): {kb['names']:,} names, {kb['concepts']:,} concepts")
        typer.echo("| | seconds | peak RSS MB | of which imports MB | tables MB |\n|---|---|---|---|---|")
        typer.echo(f"| build | {kb['build_s']:.0f} | {_mb(kb['peak_rss'])} | {_mb(kb['baseline_rss'])} "
                   f"| {_mb(kb['kb_bytes'])} |")  # fmt: skip
        typer.echo(f"| save | {kb['save_s']:.1f} | {_mb(kb['save_peak_rss'])} | | |")
        if "error" in loaded:
            typer.echo(f"| load | {loaded['error']} | | | |")
        else:
            typer.echo(f"| load (fresh process) | {loaded['load_s']:.1f} | {_mb(loaded['peak_rss'])} "
                       f"| {_mb(loaded['baseline_rss'])} | |")  # fmt: skip
        with open(results, "a") as f:
            f.write(json.dumps({**kb, "load": loaded}) + "\n")
        if not types:  # the KB part only
            continue
        vectors = workdir / f"vectors_{kb['names']}_{dim}.npy"
        if not vectors.exists():
            start = time.perf_counter()
            write_vectors(vectors, kb["names"], dim)
            typer.echo(f"wrote {vectors} in {time.perf_counter() - start:.0f} s")
        truth = workdir / f"exact_top1_{kb['names']}_{dim}_{queries}.npy"
        typer.echo(f"\n{kb['names']:,} names x {dim}-d float16 random unit vectors (memory-mapped), {queries} queries")
        typer.echo(
            "| index | build s | peak RSS MB | anonymous MB | file-backed MB | index MB | queries/s (batch) "
            "| ms/query (one at a time) | queries/s (sieve) | recall@1 |"
        )
        typer.echo("|---|---|---|---|---|---|---|---|---|---|")
        specs = types.split(",")
        for spec in sorted(specs, key=lambda s: s.split("@")[0] != "exact"):  # exact first: the reference
            row = run_child(["index", str(kb_path), str(vectors), spec, queries, str(truth)], limit)
            row.update(part="index", names=kb["names"], dim=dim, spec=spec)
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            if "error" in row:
                typer.echo(f"| {spec} | {row['error']} |")
                continue
            recall = f"{row['recall_at_1']:.3f}" if "recall_at_1" in row else "-"
            typer.echo(f"| {spec} ({row['index_type']}) | {row['build_s']:.0f} | {_mb(row['peak_rss'])} | "
                       f"{_mb(row['peak_anon'])} | {_mb(row['peak_file'])} | {_mb(row['index_bytes'])} | "
                       f"{row['qps_batch']:.0f} | {row['ms_single']:.1f} | {row['qps_sieve']:.0f} "
                       f"| {recall} |")  # fmt: skip
            for wider in row.get("sweep", []):
                recall = f"{wider['recall_at_1']:.3f}" if "recall_at_1" in wider else "-"
                typer.echo(f"| {spec}, {wider['setting']}={wider['value']} (same index) | | | | | | "
                           f"{wider['qps_batch']:.0f} | | | {recall} |")  # fmt: skip


if __name__ == "__main__":
    app()
