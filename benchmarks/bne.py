"""BNE against the packaged MiniLM encoder, with the evaluations of Phan et al. (2019), section 4.

    python -m benchmarks.bne evaluate --data ../shared/data --bne training/bne [--cache DIR]
    python -m benchmarks.bne similarity PAIRS.csv [PAIRS2.csv ...] --model training/bne \
        --model all-MiniLM-L6-v2 --term1 Term1 --term2 Term2 --score Mean
    python -m benchmarks.bne speed --model training/bne --names 20000

`evaluate` prints, for BNE and MiniLM,
- names/s encoding a fixed random sample of MEDIC names (torch threads as given);
- synonym closeness (4.1): mean coverage@k and MAP over the names of the concepts held out of BNE's training
  (the split in BNE's training.json: 1000 concepts, seeded), each name querying all the others of that pool;
- synonym retrieval MAP (4.2): NCBI-disease test mentions (not composite) as queries, BM25 top-20 MEDIC
  concepts, all their names ranked by cosine;
- NCBI-disease test Acc@1 (4.3) of gold mentions through abbreviation_resolver + composite_splitter +
  concept_normalizer with the encoder in place of the transformer and no ranker: "O-T" links to the concept of
  the nearest MEDIC name (the paper's BNE + SGW: 0.854), "XM" first takes the concept of a train/dev mention
  with the same normalized text (sieve D-T+O-T, threshold 0.9999: identical text only; the paper's + XM: 0.873),
  and "nearest name" searches the bare mention text (no abbreviation or composite handling; composite mentions
  left out).
Encoded KB names are cached under --cache (MiniLM takes minutes for MEDIC's 72k names on 2 cores).

`similarity` (4.4) prints Spearman's rho between cosine and human scores for each CSV/TSV of term pairs and each
encoder (`--model`: a `train-bne` directory, a transformers directory or id; none: the packaged MiniLM), with
the pairs used and skipped (see `evaluation.similarity`). `speed` prints names/s encoding MEDIC names, with the load
average (other jobs on the machine slow it down).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import spacy
import torch
import typer

from spacy_conceptnorm.clustering import load_encoder
from spacy_conceptnorm.evaluation.bne_metrics import (
    BM25,
    gold_mentions,
    nearest_name_accuracy,
    synonym_closeness,
    synonym_retrieval_map,
)
from spacy_conceptnorm.evaluation.gold import link_gold_mentions, mention_accuracy
from spacy_conceptnorm.evaluation.similarity import read_term_pairs, similarity_correlation
from spacy_conceptnorm.io.corpus import pubtator_to_docs
from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase, load_kb
from spacy_conceptnorm.kb.synonyms import held_out_concepts, synonym_sets
from spacy_conceptnorm.ml.bne.encoder import REPORT_FILE, BNEEncoder
from spacy_conceptnorm.ml.name_encoder import NameEncoder

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Phan et al.'s evaluations of name encoders")
EXACT = 0.9999  # a D-T stage at this cosine answers for identical normalized text only


class CachedEncoder:
    """An encoder whose vectors for known texts come from a table (the cached KB names); others are encoded.

    encoder: Any name encoder. texts (List[str]): The known texts. vectors (np.ndarray): Their unit vectors.
    """

    def __init__(self, encoder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.encoder = encoder
        self.rows = {t: i for i, t in enumerate(texts)}
        self.vectors = vectors
        self.reference = getattr(encoder, "reference", "cached")
        self.device = getattr(encoder, "device", "cpu")

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.vectors.shape[1]), dtype=np.float32)
        todo = [i for i, t in enumerate(texts) if t not in self.rows]
        known = [i for i, t in enumerate(texts) if t in self.rows]
        out[known] = self.vectors[[self.rows[texts[i]] for i in known]]
        if todo:
            out[todo] = self.encoder.encode([texts[i] for i in todo])
        return out

    def config(self) -> dict:
        return self.encoder.config()


def cached_vectors(label: str, encoder, names: list[str], cache: Path | None) -> np.ndarray:
    """The encoder's vectors of `names`, read from or written to `cache` (keyed on the label and the names)."""
    key = hashlib.sha1((label + "\n" + "\n".join(names)).encode()).hexdigest()[:16]
    path = cache / f"{label}-{key}.npy" if cache else None
    if path is not None and path.exists():
        return np.load(path)
    vectors = encoder.encode(names)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
    return vectors


def names_per_second(encoder, names: list[str], repeat: int = 1) -> float:
    """Names encoded per second, the best of `repeat` timed runs after a warm-up."""
    encoder.encode(names[:64])  # warm-up (lazy model load, allocator)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        encoder.encode(names)
        best = min(best, time.perf_counter() - start)
    return len(names) / best


def sample_names(names: list[str], n: int, seed: int = 0) -> list[str]:
    """A seeded random sample of `n` names (all of them, in order, for n = 0 or n >= len(names))."""
    if n <= 0 or n >= len(names):
        return list(names)
    return [names[i] for i in np.random.default_rng(seed).choice(len(names), size=n, replace=False)]


def encoder_label(model: str | None) -> str:
    return model or "all-MiniLM-L6-v2"


def _load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def closeness_pool(kb: KnowledgeBase, held_out: list[str]) -> tuple[list[str], list[frozenset[str]]]:
    """The names of the held-out concepts, each with the held-out concepts it names."""
    sets = synonym_sets(kb)
    labels: dict[str, set[str]] = {}
    for cid in held_out:
        for name in sets[cid]:
            labels.setdefault(name, set()).add(cid)
    names = sorted(labels)
    return names, [frozenset(labels[n]) for n in names]


def ncbi_accuracy(encoder, kb_path: Path, ncbi: Path) -> dict[str, float]:
    """Acc@1 on the NCBI-disease test gold mentions through the text components and the sieve, per setting."""
    nlp = spacy.blank("en")
    kb = load_kb(kb_path)
    splits = {s: list(pubtator_to_docs(nlp, ncbi / f"NCBI{s}set_corpus.txt")) for s in ("train", "develop", "test")}
    try:
        import pyab3p  # noqa: F401  (the paper resolves abbreviations with Ab3P)

        detector = "ab3p"
    except ImportError:
        detector = "schwartz_hearst"
    nlp.add_pipe("abbreviation_resolver", config={"detector": detector})
    nlp.add_pipe("composite_splitter")
    normalizer = nlp.add_pipe("concept_normalizer", config={"ranker": None})
    normalizer.encoder = encoder
    from spacy.training import Example

    domain = splits["train"] + splits["develop"]
    normalizer.initialize(lambda: [Example(d, d) for d in domain], nlp=nlp, kb=kb)
    out = {}
    for label, strategy, threshold in (("O-T", "O-T", None), ("XM", "D-T+O-T", EXACT)):
        normalizer.set_strategy(strategy, threshold)
        out[label] = mention_accuracy(nlp, link_gold_mentions(nlp, splits["test"]), set())["acc1"]
    return out


@app.command("evaluate")
def evaluate(
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/ and medic/"),
    bne: Path = typer.Option(Path("training/bne"), help="The trained BNE encoder directory (train-bne)"),
    cache: Path = typer.Option(None, help="Cache folder for the encoded MEDIC names"),
    speed_sample: int = typer.Option(5000, help="MEDIC names encoded for names/s (the same seeded sample for both)"),
    skip_minilm: bool = typer.Option(False, help="Only BNE"),
    threads: int = typer.Option(1, help="torch threads"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    """BNE against MiniLM on MEDIC and NCBI-disease: names/s, synonym closeness (4.1), retrieval MAP (4.2) and
    NCBI test Acc@1 (4.3)."""
    torch.set_num_threads(threads)
    kb_path = data / "medic" / "medic_06Jul2012.txt"
    ncbi = data / "ncbi-disease"
    kb = load_kb(kb_path)
    report_path = bne / REPORT_FILE
    held_out = json.loads(report_path.read_text())["held_out"] if report_path.exists() else held_out_concepts(kb, 1000)
    pool, labels = closeness_pool(kb, held_out)
    bm25 = BM25(kb)
    mentions = gold_mentions(kb, ncbi / "NCBItestset_corpus.txt")
    queries = [kb.normalizer(text) for text, _ in mentions]
    gold = [cid for _, cid in mentions]
    candidates = [bm25.top_concepts(q, 20) for q in queries]
    all_names = kb.names()
    sample = sample_names(all_names, speed_sample)
    print(f"MEDIC: {len(kb)} concepts, {len(all_names)} names; closeness pool: {len(held_out)} held-out concepts, "
          f"{len(pool)} names; NCBI test: {len(mentions)} single-concept mentions in MEDIC")  # fmt: skip

    encoders = {"BNE": BNEEncoder.load(bne)}
    if not skip_minilm:
        encoders["MiniLM"] = NameEncoder()
    results = {}
    for label, encoder in encoders.items():
        row = {"names_per_second": round(names_per_second(encoder, sample), 1)}
        start = time.perf_counter()
        name_vectors = cached_vectors(label, encoder, all_names, cache)
        row["kb_encode_seconds"] = round(time.perf_counter() - start, 1)
        rows = {n: i for i, n in enumerate(all_names)}
        row.update(synonym_closeness(name_vectors[[rows[n] for n in pool]], labels))
        query_vectors = encoder.encode(queries)
        bm25_vectors = name_vectors[[rows[n] for n in bm25.names]]
        row["ncbi_retrieval_map"] = synonym_retrieval_map(query_vectors, gold, candidates, bm25_vectors, bm25)
        row["ncbi_nearest_name_acc1"] = nearest_name_accuracy(query_vectors, gold, name_vectors, all_names, kb)
        accuracy = ncbi_accuracy(CachedEncoder(encoder, all_names, name_vectors), kb_path, ncbi)
        row.update({f"ncbi_acc1_{k}": v for k, v in accuracy.items()})
        results[label] = row
        print(f"{label}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

    keys = list(next(iter(results.values())))
    print("\n| metric | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    for key in keys:
        values = [r[key] for r in results.values()]
        cells = [f"{v:.3f}" if isinstance(v, float) and v <= 1 else f"{v}" for v in values]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print(f"torch threads: {torch.get_num_threads()}")
    if output:
        output.write_text(json.dumps(results, indent=2))


@app.command("similarity")
def similarity(
    pairs: list[Path] = typer.Argument(..., help="CSV/TSV file(s) of scored term pairs with a header row"),
    model: list[str] = typer.Option(
        [],
        "--model",
        help="Encoder(s): a train-bne directory, a transformers directory or id (repeat to compare; none: MiniLM)",
    ),
    term1: str = typer.Option("term1", "--term1", help="Column of the first term (case ignored if no exact match)"),
    term2: str = typer.Option("term2", "--term2", help="Column of the second term"),
    score: str = typer.Option("score", "--score", help="Column of the human score"),
    delimiter: str = typer.Option(
        None, "--delimiter", help="Field separator (default: tab if the header has one, else comma)"
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Fail on the first bad row (file:line) instead of skipping and counting it"
    ),
    threads: int = typer.Option(1, "--threads", help="torch threads"),
    output: Path = typer.Option(None, "--output", help="Write the results as JSON here"),
) -> None:
    """Semantic similarity and relatedness (Phan et al. 2019, 4.4): Spearman's rho between the cosine of each
    pair's vectors and the human scores."""
    torch.set_num_threads(threads)
    read = [read_term_pairs(p, term1, term2, score, delimiter, strict) for p in pairs]  # all checked first
    results = []
    for name in model or [None]:
        encoder = load_encoder(name)
        for path, term_pairs in zip(pairs, read):
            row = {"model": encoder_label(name), **similarity_correlation(encoder, term_pairs)}
            results.append(row)
            typer.echo(f"{row['model']}  {path}: spearman {row['spearman']:.4f} (p {row['p_value']:.3g}), "
                       f"{row['pairs_used']} pairs used, {row['pairs_skipped']} skipped")  # fmt: skip
            for skipped in row["skipped"]:
                typer.echo(f"  skipped {path}:{skipped['line']}: {skipped['reason']}")
    if output:
        output.write_text(json.dumps(results, indent=2))


@app.command("speed")
def speed(
    model: list[str] = typer.Option([], "--model", help="Encoder(s) as for `similarity` (none: training/bne)"),
    kb: Path = typer.Option(Path("../shared/data/medic/medic_06Jul2012.txt"), "--kb", help="Names to encode"),
    names: int = typer.Option(20000, "--names", help="A seeded random sample of this many KB names (0: all)"),
    repeat: int = typer.Option(3, "--repeat", help="Timed runs; the best is reported"),
    threads: int = typer.Option(1, "--threads", help="torch threads"),
    seed: int = typer.Option(0, "--seed", help="Seed of the sample"),
) -> None:
    """Names encoded per second (the best of --repeat runs), with the machine's load average before and after."""
    torch.set_num_threads(threads)
    sample = sample_names(load_kb(kb).names(), names, seed)
    for name in model or ["training/bne"]:
        encoder = load_encoder(name)
        before = _load_average()
        rate = names_per_second(encoder, sample, repeat)
        typer.echo(f"{encoder_label(name)}: {rate:,.0f} names/s ({len(sample):,} names, best of {repeat}, "
                   f"{torch.get_num_threads()} torch thread(s); load average {before} before, "
                   f"{_load_average()} after)")  # fmt: skip


if __name__ == "__main__":
    app()
