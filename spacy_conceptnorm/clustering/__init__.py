"""Embedding-based term clustering and its O(n) pairwise evaluation (CODER++, Zeng et al. 2022, sections 3.1-3.2).

    from spacy_conceptnorm.clustering import cluster_terms
    labels = cluster_terms(["heart attack", "myocardial infarction", "asthma"], threshold=0.6)

Terms are encoded with a name encoder, each term's top-m neighbours found with FAISS/torch (`graph`), pairs kept
when their cosine is >= θ, and clusters are the connected components. `evaluate` scores a clustering against
gold concept ids; `sweep` scores many θ from one search; `inputs` reads term lists, knowledge bases and the NIL
mentions of an `annotate` output; `cluster_file` is the `cluster` command.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..io.files import atomic_open
from .graph import NeighbourGraph, check_threshold, check_top_m, encode_terms, neighbour_graph
from .inputs import TermSet, kb_terms, read_input, read_nil_mentions, read_terms
from .pair_scores import PairCounts, count_brute_force, count_clusters, count_pairs
from .sweep import DEFAULT_THRESHOLDS, best, plot_sweep, sweep, write_sweep

__all__ = [
    "DEFAULT_THRESHOLDS", "NeighbourGraph", "PairCounts", "TermSet", "best", "cluster_file", "cluster_records",
    "cluster_terms", "count_brute_force", "count_clusters", "count_pairs", "encode_terms", "kb_terms",
    "load_encoder", "neighbour_graph", "plot_sweep", "read_input", "read_nil_mentions", "read_terms", "sweep",
    "term_graph", "write_sweep",
]  # fmt: skip

DEFAULT_THRESHOLD = 0.88  # the best θ for connected components with the packaged MiniLM on MEDIC 2012 names


def load_encoder(model: str | None = None):
    """The name encoder for `model`: a saved BNE encoder (`train-bne`), a transformers directory or id, or None
    for the packaged all-MiniLM-L6-v2."""
    from ..ml.bne.encoder import FORMAT_TAG, BNEEncoder
    from ..ml.name_encoder import NameEncoder

    config = Path(model) / "config.json" if model else None
    if config is not None and config.is_file() and f'"{FORMAT_TAG}"' in config.read_text(errors="replace")[:200]:
        return BNEEncoder.load(model)
    return NameEncoder(model)


def term_graph(
    texts: Sequence[str],
    encoder=None,
    top_m: int = 50,
    min_score: float = -1.0,
    index_type: str = "auto",
    progress: bool = False,
) -> NeighbourGraph:
    """Encode distinct `texts` and search their neighbour graph once (reuse it for any θ >= `min_score`).

    texts (Sequence[str]): Distinct terms.
    encoder: A NameEncoder or anything with `encode(texts)` returning unit rows; None: the packaged default.
    top_m (int): Neighbours per term.
    min_score (float): Lowest threshold you will ask the graph for.
    index_type (str): "auto" (exact, IVF beyond 200k terms), "exact", "flat", "hnsw" or "ivf".
    """
    check_top_m(top_m)
    check_threshold(min_score, "min_score")
    vectors = encode_terms(encoder or load_encoder(), list(texts), progress=progress)
    return neighbour_graph(vectors, top_m, min_score, index_type, progress=progress)


def cluster_terms(
    terms: Sequence[str], encoder=None, top_m: int = 50, threshold: float = DEFAULT_THRESHOLD, index_type: str = "auto"
) -> np.ndarray:
    """Cluster id per term: terms i and j share an id when a chain of pairs links them, each pair being in one
    term's top-m neighbours with a cosine >= `threshold`. Identical texts are encoded once and share a cluster.

    terms (Sequence[str]): The terms (duplicates allowed).
    encoder: A NameEncoder or a stand-in; None: the packaged all-MiniLM-L6-v2.
    top_m (int): Neighbours searched per term (>= 1).
    threshold (float): Cosine in [-1, 1].
    index_type (str): See `term_graph`.
    RETURNS (np.ndarray): int64 cluster ids, numbered in order of first appearance.
    """
    threshold = check_threshold(threshold)
    distinct, inverse = np.unique(np.asarray(list(terms), dtype=object).astype(str), return_inverse=True)
    graph = term_graph(list(distinct), encoder, top_m, threshold, index_type)
    labels = graph.clusters(threshold)[inverse]
    _, first, renumbered = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # cluster ids by first appearance in `terms`
    return order[renumbered].astype(np.int64)


def cluster_records(terms: TermSet, labels: np.ndarray) -> list[dict]:
    """One record per cluster, the most frequent first: its members (surface forms with counts), total count,
    a proposed name (the most frequent surface form) and, when known, member concept ids and document count."""
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        groups.setdefault(label, []).append(i)
    records = []
    for label, members in groups.items():
        forms = [(form, count, i) for i in members for form, count in terms.surfaces[i].most_common()]
        forms.sort(key=lambda f: (-f[1], f[0]))
        record = {
            "cluster": label,
            "name": forms[0][0],
            "size": len(members),
            "count": sum(terms.counts[i] for i in members),
        }
        if terms.documents is not None:
            record["documents"] = len(set().union(*(terms.documents[i] for i in members)))
        record["members"] = [
            {"text": form, "count": count, **({"concept_id": terms.gold[i]} if terms.gold else {})}
            for form, count, i in forms
        ]
        records.append(record)
    records.sort(key=lambda r: (-r["count"], r["cluster"]))
    return records


def cluster_file(
    path: str | Path,
    output: str | Path,
    encoder=None,
    top_m: int = 50,
    threshold: float = DEFAULT_THRESHOLD,
    do_sweep: bool = False,
    input_format: str = "auto",
    ambiguous: str = "drop",
    index_type: str = "auto",
    progress: bool = False,
) -> dict:
    """The `cluster` command: read TERMS, cluster, write OUTPUT (JSONL, one cluster a line, atomically); with
    `do_sweep` also OUTPUT with suffix .sweep.json and .sweep.png. Returns a summary (and, with gold, the
    pairwise scores at `threshold`)."""
    threshold, top_m = check_threshold(threshold), check_top_m(top_m)
    start = time.perf_counter()
    terms = read_input(path, input_format, ambiguous)
    lowest = min(threshold, *DEFAULT_THRESHOLDS) if do_sweep else threshold
    graph = term_graph(terms.texts, encoder, top_m, lowest, index_type, progress)
    labels = graph.clusters(threshold)
    output = Path(output)
    with atomic_open(output, "w") as f:
        for record in cluster_records(terms, labels):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    summary = {
        "input": terms.source, "terms": len(terms.texts), "dropped_ambiguous": terms.dropped,
        "clusters": int(labels.max()) + 1 if len(labels) else 0, "predicted_pairs": graph.count_above(threshold),
        "index": graph.index_type, "output": str(output),
    }  # fmt: skip
    if terms.gold is not None:
        summary["pairs"] = count_pairs(*graph.pairs(threshold), terms.gold).as_dict()
        summary["clusters_eval"] = count_clusters(labels, terms.gold).as_dict()
    if do_sweep:
        rows = sweep(graph, sorted({threshold, *DEFAULT_THRESHOLDS}), terms.gold)
        meta = {"input": str(path), "encoder": _describe(encoder), "top_m": top_m, "terms": len(terms.texts)}
        summary["sweep"] = str(output.with_suffix(".sweep.json"))
        write_sweep(summary["sweep"], rows, meta)
        if terms.gold is not None:
            summary["plot"] = str(output.with_suffix(".sweep.png"))
            plot_sweep(summary["plot"], {_describe(encoder): rows}, f"Term clustering: {Path(path).name}")
    summary["seconds"] = round(time.perf_counter() - start, 2)
    return summary


def _describe(encoder) -> str:
    if encoder is None:
        return "all-MiniLM-L6-v2"
    return str(getattr(encoder, "reference", type(encoder).__name__))
