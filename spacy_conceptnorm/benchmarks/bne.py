"""BNE against the packaged MiniLM encoder, with the evaluations of Phan et al. (2019), section 4.

    python -m spacy_conceptnorm.benchmarks.bne --data ../shared/data --bne training/bne [--cache DIR]

For each encoder it prints
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
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import spacy
import torch
import typer

from ..bne.data import held_out_concepts, synonym_sets
from ..bne.encoder import REPORT_FILE, BNEEncoder
from ..bne.evaluate import BM25, gold_mentions, nearest_name_accuracy, synonym_closeness, synonym_retrieval_map
from ..corpus import pubtator_to_docs
from ..encoder import NameEncoder
from ..evaluation.gold import link_gold_mentions, mention_accuracy
from ..kb import KnowledgeBase, load_kb

app = typer.Typer(add_completion=False)
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


def names_per_second(encoder, names: list[str]) -> float:
    encoder.encode(names[:64])  # warm-up (lazy model load, allocator)
    start = time.perf_counter()
    encoder.encode(names)
    return len(names) / (time.perf_counter() - start)


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


@app.command()
def main(
    data: Path = typer.Option(Path("../shared/data"), help="Folder with ncbi-disease/ and medic/"),
    bne: Path = typer.Option(Path("training/bne"), help="The trained BNE encoder directory (train-bne)"),
    cache: Path = typer.Option(None, help="Cache folder for the encoded MEDIC names"),
    speed_sample: int = typer.Option(5000, help="MEDIC names encoded for names/s (the same seeded sample for both)"),
    skip_minilm: bool = typer.Option(False, help="Only BNE"),
    threads: int = typer.Option(1, help="torch threads"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
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
    rng = np.random.default_rng(0)
    sample = [all_names[i] for i in rng.choice(len(all_names), size=min(speed_sample, len(all_names)), replace=False)]
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


if __name__ == "__main__":
    app()
