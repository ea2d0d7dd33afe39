"""Term clustering on MEDIC 2012 (CODER++ section 5.2's table and Figure 2), at scale, and the O(n) evaluator's
speed against brute force.

    python -m benchmarks.clustering table --medic ../shared/data/medic/medic_06Jul2012.txt \\
        [--model DIR_OR_ID ...] [--top-m 50] [--cache DIR] [--output DIR]
    python -m benchmarks.clustering scale --medic ... [--terms 1000000] [--cache DIR]
    python -m benchmarks.clustering eval-speed --medic ... [--terms 5000] [--cache DIR]

Terms are MEDIC's ontology names, normalized as the linker encodes them; gold = concept id; names of several
concepts are left out (`inputs.kb_terms`). `table`: per encoder ("default" is the packaged all-MiniLM-L6-v2), the
best θ by F1 under the paper's pair reading and under connected components, written to OUTPUT/clustering.json
with the sweep plot OUTPUT/clustering_sweep.png. `--cache` keeps each encoder's vectors (names + vectors .npz),
so a second run skips the encoder.

`scale`: a list of `--terms` terms made of MEDIC's names repeated, each copy's vector perturbed by Gaussian noise
(`--noise`, then renormalized) and keeping its name's gold concept. Each distinct string is encoded once: copies
share their string, so only the perturbation makes them distinct points, and the run measures what grows with n
(index, neighbour search, components, evaluation), not the encoder (about 130 names/s on 2 cores here). Times
per stage and peak memory (`resource.getrusage`, the whole process) are printed.

`eval-speed`: on `--terms` random names, the linear counts (`count_pairs`, `count_clusters`) against counting
every pair (`count_brute_force`, numpy in blocks), both readings, checked equal.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np
import typer

from spacy_conceptnorm.clustering import (
    DEFAULT_THRESHOLDS,
    NeighbourGraph,
    best,
    count_brute_force,
    count_clusters,
    count_pairs,
    kb_terms,
    load_encoder,
    neighbour_graph,
    plot_sweep,
    sweep,
)
from spacy_conceptnorm.clustering.graph import build_index, pick_index
from spacy_conceptnorm.io.files import write_json
from spacy_conceptnorm.kb.knowledge_base import ONTOLOGY, load_kb

app = typer.Typer(add_completion=False, no_args_is_help=True)
MEDIC = Path("../shared/data/medic/medic_06Jul2012.txt")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def medic_vectors(medic: Path, model: str, cache: Path | None) -> tuple[list[str], list[str], np.ndarray, float]:
    """MEDIC's unambiguous names, their gold concepts and vectors, and the seconds spent encoding (0 if cached)."""
    kb = load_kb(medic)
    terms = kb_terms(kb)
    names = kb.names(ONTOLOGY)
    cached = cache / f"{Path(model).name or 'default'}.npz" if cache else None
    seconds = 0.0
    if cached is not None and cached.exists():
        data = np.load(cached, allow_pickle=True)
        table = dict(zip(data["names"].tolist(), data["vectors"]))
    else:
        start = time.perf_counter()
        vectors = load_encoder(None if model == "default" else model).encode(names, progress=True)
        seconds = time.perf_counter() - start
        typer.echo(f"{model}: {len(names)} names encoded in {seconds:.0f} s ({len(names) / seconds:.0f} names/s)")
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cached, names=np.array(names, dtype=object), vectors=vectors)
        table = dict(zip(names, vectors))
    vectors = np.stack([table[t] for t in terms.texts]).astype(np.float32)
    return terms.texts, terms.gold, vectors, seconds


def fmt(row: dict, reading: str) -> str:
    s = row[reading]
    return f"θ0 {row['threshold']:.2f}  P {s['precision']:.3f}  R {s['recall']:.3f}  F1 {s['f1']:.3f}"


@app.command("table")
def table(
    medic: Path = typer.Option(MEDIC, help="MEDIC file (CTD_diseases.tsv or medic_06Jul2012.txt)"),
    model: list[str] = typer.Option(["default"], "--model", help="Encoders: 'default' or a directory or id"),
    top_m: int = typer.Option(50, "--top-m"),
    cache: Path = typer.Option(None, help="Directory for the encoders' vectors"),
    output: Path = typer.Option(Path("metrics"), "--output", "-o"),
) -> None:
    """Best-θ P/R/F1 per encoder on MEDIC names, and the sweep plot."""
    results, curves = {}, {}
    for name in model:
        texts, gold, vectors, encode_s = medic_vectors(medic, name, cache)
        start = time.perf_counter()
        graph = neighbour_graph(vectors, top_m, min(DEFAULT_THRESHOLDS), progress=True)
        search_s = time.perf_counter() - start
        start = time.perf_counter()
        rows = sweep(graph, DEFAULT_THRESHOLDS, gold)
        sweep_s = time.perf_counter() - start
        curves[name] = rows
        results[name] = {
            "terms": len(texts), "concepts": len(set(gold)), "top_m": top_m, "index": graph.index_type,
            "pairs_kept": len(graph.rows), "encode_seconds": round(encode_s, 1), "search_seconds": round(search_s, 1),
            "sweep_seconds": round(sweep_s, 1), "best_pairs": best(rows, "pairs"),
            "best_clusters": best(rows, "clusters_eval"), "sweep": rows,
        }  # fmt: skip
        typer.echo(
            f"{name}: {len(texts)} terms, {len(set(gold))} concepts, top-{top_m} {graph.index_type} search "
            f"{search_s:.0f} s, sweep of {len(rows)} θ {sweep_s:.1f} s"
        )
        typer.echo(f"  pairs (CODER++ 3.2):   {fmt(best(rows, 'pairs'), 'pairs')}")
        typer.echo(f"  connected components:  {fmt(best(rows, 'clusters_eval'), 'clusters_eval')}")
    write_json(output / "clustering.json", results)
    plot_sweep(output / "clustering_sweep.png", curves, f"MEDIC 2012 term clustering (top-{top_m})")
    typer.echo(f"-> {output / 'clustering.json'}, {output / 'clustering_sweep.png'}")


@app.command("scale")
def scale(
    medic: Path = typer.Option(MEDIC),
    model: str = typer.Option("default", "--model"),
    terms: int = typer.Option(1_000_000, help="Terms in the synthetic list"),
    noise: float = typer.Option(0.02, help="Gaussian noise per vector component of each copy"),
    top_m: int = typer.Option(50, "--top-m"),
    threshold: float = typer.Option(0.8),
    index: str = typer.Option("auto", help="auto, exact, flat, hnsw or ivf"),
    nprobe: int = typer.Option(8, help="IVF lists visited per query"),
    nlist: int = typer.Option(0, help="IVF lists (0: 4 sqrt(n))"),
    check: int = typer.Option(1000, help="Queries whose exact top-m pairs >= θ are looked for in the graph"),
    cache: Path = typer.Option(None),
    seed: int = typer.Option(0),
) -> None:
    """Cluster and evaluate a synthetic list of `terms` terms; time and peak memory per stage."""
    names, gold, base, _ = medic_vectors(medic, model, cache)
    stages: dict[str, float] = {}
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    source = np.arange(terms) % len(names)  # copy k of every name before copy k + 1 of any
    vectors = base[source]
    for lo in range(0, terms, 100_000):  # in place, in slices: no second n x d array of noise
        part = vectors[lo : lo + 100_000]
        part += rng.normal(scale=noise, size=part.shape).astype(np.float32)
        part /= np.linalg.norm(part, axis=1, keepdims=True)
    gold_codes = np.unique(np.asarray(gold), return_inverse=True)[1][source]
    stages["build vectors"] = time.perf_counter() - start
    chosen = pick_index(terms, vectors.shape[1], index)
    typer.echo(f"{terms} terms ({len(names)} distinct strings, noise {noise}), {vectors.shape[1]}-d, {chosen} index")
    start = time.perf_counter()
    build_index(vectors[:1000], chosen, nprobe)  # warm-up of FAISS/torch, not timed below
    stages["warm-up"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = neighbour_graph(vectors, top_m, threshold, chosen, nprobe, progress=True, nlist=nlist)
    stages["index + search + dedupe"] = time.perf_counter() - start
    start = time.perf_counter()
    labels = graph.clusters(threshold)
    stages["components"] = time.perf_counter() - start
    start = time.perf_counter()
    by_pairs = count_pairs(graph.rows, graph.cols, gold_codes)
    by_clusters = count_clusters(labels, gold_codes)
    stages["evaluation (both readings)"] = time.perf_counter() - start
    for stage, seconds in stages.items():
        typer.echo(f"  {stage:<28} {seconds:8.1f} s")
    typer.echo(f"  pairs >= {threshold}: {len(graph.rows)}, clusters: {int(labels.max()) + 1}")
    typer.echo(f"  pairs:    P {by_pairs.precision:.3f}  R {by_pairs.recall:.3f}  F1 {by_pairs.f1:.3f}")
    typer.echo(f"  clusters: P {by_clusters.precision:.3f}  R {by_clusters.recall:.3f}  F1 {by_clusters.f1:.3f}")
    typer.echo(f"  total {sum(stages.values()):.0f} s, peak memory {peak_mib():.0f} MiB (ru_maxrss)")
    if check:
        recall = pair_recall(graph, vectors, check, threshold)
        typer.echo(f"  share of exact top-{top_m} pairs >= {threshold} found ({check} queries): {recall:.4f}")


def pair_recall(graph: NeighbourGraph, vectors: np.ndarray, queries: int, threshold: float, seed: int = 1) -> float:
    """Of each sampled query's exact top-m pairs with cosine >= `threshold`, the share in the graph (what an
    approximate index misses)."""
    n, m = graph.n, graph.top_m
    keys = np.sort(graph.rows * n + graph.cols)
    sample = np.random.default_rng(seed).choice(n, min(queries, n), replace=False)
    wanted = found = 0
    for block in np.array_split(sample, max(1, len(sample) // 20)):
        scores = vectors[block] @ vectors.T  # exact, 20 queries at a time
        scores[np.arange(len(block)), block] = -np.inf
        top = np.argpartition(-scores, m, axis=1)[:, :m]
        keep = np.take_along_axis(scores, top, 1) >= np.float32(threshold)
        q = np.broadcast_to(block[:, None], top.shape)[keep]
        pair_keys = np.minimum(top[keep], q) * n + np.maximum(top[keep], q)
        wanted += len(pair_keys)
        at = np.searchsorted(keys, pair_keys).clip(max=max(len(keys) - 1, 0))  # np.isin: ~30 s on 19M keys
        found += int((keys[at] == pair_keys).sum()) if len(keys) else 0
    return found / wanted if wanted else 1.0


@app.command("eval-speed")
def eval_speed(
    medic: Path = typer.Option(MEDIC),
    model: str = typer.Option("default", "--model"),
    terms: int = typer.Option(5000),
    top_m: int = typer.Option(50, "--top-m"),
    threshold: float = typer.Option(0.8),
    cache: Path = typer.Option(None),
    seed: int = typer.Option(0),
) -> None:
    """The O(n) counts against brute force on `terms` random MEDIC names (times, and a check that they agree)."""
    _, gold, vectors, _ = medic_vectors(medic, model, cache)
    pick = np.sort(np.random.default_rng(seed).choice(len(gold), terms, replace=False))
    gold, vectors = [gold[i] for i in pick], vectors[pick]
    graph = neighbour_graph(vectors, top_m, threshold)
    labels = graph.clusters(threshold)
    keys = np.sort(graph.rows * terms + graph.cols)
    readings = {
        "pairs": (lambda: count_pairs(graph.rows, graph.cols, gold),
                  lambda r, c: np.isin(r[:, None] * terms + c[None, :], keys)),
        "clusters": (lambda: count_clusters(labels, gold), lambda r, c: labels[r][:, None] == labels[c][None, :]),
    }  # fmt: skip
    report = {}
    for reading, (linear, together) in readings.items():
        start = time.perf_counter()
        fast = linear()
        fast_s = time.perf_counter() - start
        start = time.perf_counter()
        slow = count_brute_force(together, gold)
        slow_s = time.perf_counter() - start
        assert fast == slow, (fast, slow)
        report[reading] = {"linear_s": fast_s, "brute_force_s": slow_s, "counts": fast.as_dict()}
        typer.echo(
            f"{reading:>8}: O(n) {1000 * fast_s:.1f} ms, brute force {slow_s:.2f} s "
            f"({slow_s / fast_s:.0f}x), equal counts: TP {fast.tp} FP {fast.fp} FN {fast.fn} TN {fast.tn}"
        )
    typer.echo(json.dumps({"terms": terms, "pairs": len(graph.rows), "threshold": threshold}))


if __name__ == "__main__":
    app()
