"""Similarity search over the knowledge base: search targets, representation types and the sieve.

Xu & Bethard (2021), section 3.2. A *stage* names a target and a representation:

- target `O` searches ontology names, `D` domain names (annotated mentions, user synonyms), `OD` both;
- representation `T` compares the mention to each name's vector, `C` to each concept's vector, the mean of the
  vectors of its names under that target (re-normalized, so the score stays a cosine).

A *strategy* is one stage (`OD-T`) or a sieve of stages (`D-T+OD-T`): a stage answers when its best score
reaches `threshold`, else the next stage is asked; the last stage always answers.

Ties (equal scores, e.g. one name shared by several concepts) are broken deterministically, where the paper
picks at random: first the concept whose canonical name is the matched name, then the smaller concept id.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .encoder import NameEncoder
from .errors import ConceptNormError, Errors
from .index import VectorIndex
from .kb import DOMAIN, ONTOLOGY, KnowledgeBase
from .util import atomic_open, read_msgpack, write_msgpack

TARGET_BITS = {"O": 1, "D": 2, "OD": 3}
TARGET_SOURCES = {"O": (ONTOLOGY,), "D": (DOMAIN,), "OD": (ONTOLOGY, DOMAIN)}
FORMAT_TAG, FORMAT_VERSION = "spacy_conceptnorm.searcher", 1
ALL_STRATEGIES = [
    "O-T", "O-C", "D-T", "D-C", "OD-T", "OD-C",
    "D-T+O-T", "D-T+O-C", "D-C+O-T", "D-C+O-C", "D-T+OD-T", "D-T+OD-C", "D-C+OD-T", "D-C+OD-C",
]  # fmt: skip


@dataclass(frozen=True)
class Stage:
    target: str
    representation: str

    def __str__(self) -> str:
        return f"{self.target}-{self.representation}"


def parse_strategy(strategy: str) -> tuple[Stage, ...]:
    """`"D-T+OD-T"` -> (Stage("D", "T"), Stage("OD", "T"))."""
    stages = []
    for part in strategy.replace(" ", "").split("+"):
        target, _, rep = part.partition("-")
        if target not in TARGET_BITS or rep not in ("T", "C"):
            raise ConceptNormError(Errors.E201.format(strategy=strategy))
        stages.append(Stage(target, rep))
    return tuple(stages)


@dataclass
class Match:
    """The answer for one query.

    candidates (List[Tuple[str, float]]): Concept ids and cosine scores, best first.
    names (List[str]): The name that gave each candidate its score (for -C stages, the concept's canonical name).
    stage (str): The sieve stage that answered, e.g. "D-T"; None when nothing was searched (an empty query).
    evidence (Dict[str, float]): What the confidence model reads (set by the ranker; empty from the sieve alone).
    """

    candidates: list[tuple[str, float]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    stage: str | None = None
    evidence: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None

    @property
    def score(self) -> float:
        return self.candidates[0][1] if self.candidates else float("-inf")


class SieveSearcher:
    """Name vectors, their FAISS indexes per source, and the sieve search over them.

    kb (KnowledgeBase): The concepts and names searched.
    encoder (NameEncoder): Encodes names and queries.
    strategy (str): Stages joined by "+", e.g. "D-T+OD-T" (see `ALL_STRATEGIES`).
    threshold (float): A stage before the last answers only when its best cosine reaches this.
    top_k (int): Candidates returned per query.
    index (dict): `VectorIndex` settings (`index_type`: flat, hnsw, ivf, and their parameters).
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        encoder: NameEncoder,
        strategy: str = "D-T+OD-T",
        threshold: float = 0.95,
        top_k: int = 5,
        index: dict | None = None,
    ) -> None:
        self.validate(strategy, top_k)
        self.kb = kb
        self.encoder = encoder
        self.stages = parse_strategy(strategy)
        self.threshold = threshold
        self.top_k = top_k
        self.index_config = dict(index or {})
        self.rows: dict[str, int] = {}  # normalized name -> row of `vectors`
        self.row_names: list[str | None] = []
        self._freed: dict[str, int] = {}  # removed name -> its free row, whose vector is kept until taken
        self.vectors = np.zeros((0, 0), dtype=np.float32)
        self.indexes: dict[str, VectorIndex] = {}
        self._concept_indexes: dict[str, tuple[list[str], VectorIndex, np.ndarray]] = {}
        self._canonical: dict[str, str] | None = None
        self.hidden: frozenset[str] = frozenset()  # concepts searched as if absent (NIL calibration's held-out)

    @staticmethod
    def validate(strategy: str, top_k: int) -> None:
        """Raise ConceptNormError for a strategy or top_k the searcher cannot use."""
        parse_strategy(strategy)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ConceptNormError(Errors.E202.format(top_k=top_k))

    @property
    def strategy(self) -> str:
        return "+".join(map(str, self.stages))

    @strategy.setter
    def strategy(self, value: str) -> None:
        self.stages = parse_strategy(value)

    # --- building and changing ----------------------------------------------------------------------------------
    def build(self, progress: bool = False) -> None:
        """Encode every name of the knowledge base and index it under its sources."""
        names = self.kb.names()
        self.vectors = self.encoder.encode(names, progress=progress)
        self.rows = {name: i for i, name in enumerate(names)}
        self.row_names = list(names)
        self._freed = {}
        self.indexes = {}
        for source in (ONTOLOGY, DOMAIN):
            rows = np.array([self.rows[n] for n in self.kb.names(source)], dtype=np.int64)
            self._index(source).add(rows, self.vectors[rows])
        self._changed()

    def _index(self, source: str) -> VectorIndex:
        if source not in self.indexes:
            self.indexes[source] = VectorIndex(self.vectors.shape[1], **self.index_config)
        return self.indexes[source]

    def add_names(self, names: Iterable[str], source: str) -> None:
        """Index normalized names (already linked in the KB) under `source`, encoding those not seen before. New
        names take the rows freed by removed names first, so adding and removing names does not grow `vectors`."""
        names = list(dict.fromkeys(names))
        if not names:
            return
        for name in names:  # removed earlier and its row still free: its vector is still there
            row = self._freed.pop(name, None) if name not in self.rows else None
            if row is not None:
                self.rows[name], self.row_names[row] = row, name
        unseen = [n for n in names if n not in self.rows]
        if unseen:
            new = self.encoder.encode(unseen)
            free = self._free_rows()[: len(unseen)]
            taken = set(free)
            self._freed = {n: r for n, r in self._freed.items() if r not in taken}
            start = len(self.row_names)
            rows = free + list(range(start, start + len(unseen) - len(free)))
            if len(rows) > len(free):
                grown = np.zeros((rows[-1] + 1, new.shape[1]), dtype=np.float32)
                if len(self.vectors):
                    grown[: len(self.vectors)] = self.vectors
                self.vectors = grown
                self.row_names.extend([None] * (len(rows) - len(free)))
            self.vectors[rows] = new
            for row, name in zip(rows, unseen):
                self.rows[name] = row
                self.row_names[row] = name
        rows = np.array([self.rows[n] for n in names], dtype=np.int64)
        self._index(source).add(rows, self.vectors[rows])
        self._changed()

    def _free_rows(self) -> list[int]:
        """Rows of removed names that no index still holds (an HNSW index only hides removed rows)."""
        hidden = set().union(*(set(index.removed) for index in self.indexes.values()))
        return [i for i, name in enumerate(self.row_names) if name is None and i not in hidden]

    def remove_names(self, names: Iterable[str], source: str) -> None:
        """Drop normalized names that no longer have any concept under `source` from that source's index."""
        names = [n for n in names if n in self.rows]
        if not names:
            return
        self._index(source).remove(np.array([self.rows[n] for n in names], dtype=np.int64))
        for name in names:
            if not self.kb.concepts_for(name):  # gone from the KB entirely: free its row
                self._freed[name] = self.rows.pop(name)
                self.row_names[self._freed[name]] = None
        self._changed()

    def _changed(self) -> None:
        self._concept_indexes.clear()
        self._canonical = None

    # --- searching ----------------------------------------------------------------------------------------------
    def query_vectors(self, keys: Sequence[str]) -> np.ndarray:
        """Vectors for normalized queries: a query equal to a known name reuses its vector (the same text gives
        the same vector), the others are encoded, each distinct text once."""
        out = np.zeros((len(keys), self.vectors.shape[1]), dtype=np.float32)
        todo: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            row = self.rows.get(key)
            if row is not None:
                out[i] = self.vectors[row]
            else:
                todo.setdefault(key, []).append(i)
        if todo:  # an encoder with `encode_queries` gives each text bits that do not depend on the batch
            encoded = getattr(self.encoder, "encode_queries", self.encoder.encode)(list(todo))
            for vec, positions in zip(encoded, todo.values()):
                out[positions] = vec
        return out

    def search(self, texts: Sequence[str], strategy: str | None = None, top_k: int | None = None) -> list[Match]:
        """Search mention texts through the sieve; one Match per text, in order."""
        keys = [self.kb.normalizer(t) for t in texts]
        answers = self.search_keys(list(dict.fromkeys(k for k in keys if k)), strategy, top_k)
        return [answers.get(k, Match()) for k in keys]

    def search_keys(
        self,
        unique: Sequence[str],
        strategy: str | None = None,
        top_k: int | None = None,
        vectors: np.ndarray | None = None,
    ) -> dict[str, Match]:
        """Search distinct normalized queries through the sieve (`top_k` overrides the configured one; `vectors`,
        the queries' `query_vectors`, saves encoding them again)."""
        if top_k is not None and top_k != self.top_k:
            configured, self.top_k = self.top_k, top_k
            try:
                return self.search_keys(unique, strategy, None, vectors)
            finally:
                self.top_k = configured
        stages = parse_strategy(strategy) if strategy else self.stages
        vectors = self.query_vectors(unique) if vectors is None else vectors
        answers: dict[str, Match] = {}
        pending = list(range(len(unique)))
        for n, stage in enumerate(stages):
            if not pending:
                break
            matches = self._search_stage(stage, vectors[pending])
            last = n == len(stages) - 1
            still = []
            for i, match in zip(pending, matches):
                if last or match.score >= self.threshold:
                    answers[unique[i]] = match
                else:
                    still.append(i)
            pending = still
        return answers

    def _search_stage(self, stage: Stage, queries: np.ndarray) -> list[Match]:
        """One stage's matches; hidden concepts are dropped before the sieve tests its threshold, so a stage that
        would answer only thanks to one passes the query on, as it would without the concept."""
        if not self.hidden:
            return self._search_stage_all(stage, queries, self.top_k)
        return [
            _without(m, self.hidden, self.top_k)
            for m in self._search_stage_all(stage, queries, self.top_k + len(self.hidden))
        ]

    def _search_stage_all(self, stage: Stage, queries: np.ndarray, top_k: int) -> list[Match]:
        if stage.representation == "C":
            return self._search_concepts(stage, queries, top_k)
        mask = TARGET_BITS[stage.target]
        sources = [s for s in TARGET_SOURCES[stage.target] if s in self.indexes]
        hits = [self._index(source).search(queries, _fetch(top_k))[1] for source in sources]
        matches = []
        for q in range(len(queries)):
            rows = np.array(list(dict.fromkeys(r for ids in hits for r in ids[q] if r >= 0)), dtype=np.int64)
            best: dict[str, tuple[float, str]] = {}
            for row, score in zip(rows, exact_scores(self.vectors, rows, queries[q])):
                name = self.row_names[row]
                for cid in self.kb.concepts_for(name, mask):
                    if cid not in best or score > best[cid][0]:
                        best[cid] = (score, name)
            matches.append(self._rank(best, stage, top_k))
        return matches

    def _search_concepts(self, stage: Stage, queries: np.ndarray, top_k: int) -> list[Match]:
        concept_ids, index, matrix = self._concept_index(stage.target)
        _, ids = index.search(queries, _fetch(top_k))
        canonical = self._canonical_names()
        matches = []
        for q, found in enumerate(ids):
            found = found[found >= 0]
            scores = exact_scores(matrix, found, queries[q])
            best = {concept_ids[j]: (score, canonical[concept_ids[j]]) for j, score in zip(found, scores)}
            matches.append(self._rank(best, stage, top_k))
        return matches

    def _rank(self, best: dict[str, tuple[float, str]], stage: Stage, top_k: int) -> Match:
        canonical = self._canonical_names()
        order = sorted(best, key=lambda c: (-round(best[c][0], 5), canonical.get(c) != best[c][1], c))[:top_k]
        return Match([(c, best[c][0]) for c in order], [self.kb.surface(best[c][1]) for c in order], str(stage))

    def _canonical_names(self) -> dict[str, str]:
        if self._canonical is None:
            norm = self.kb.normalizer
            self._canonical = {cid: norm(c.canonical_name) for cid, c in self.kb.concepts.items()}
        return self._canonical

    def _concept_index(self, target: str) -> tuple[list[str], VectorIndex, np.ndarray]:
        """Concept vectors for a target: the mean of the vectors of each concept's names there, re-normalized."""
        if target not in self._concept_indexes:
            mask = TARGET_BITS[target]
            slot: dict[str, int] = {}
            pairs = [
                (slot.setdefault(cid, len(slot)), row)
                for name, row in self.rows.items()
                for cid in self.kb.concepts_for(name, mask)
            ]
            matrix = np.zeros((len(slot), self.vectors.shape[1]), dtype=np.float32)
            if pairs:
                concept_idx, rows = map(np.array, zip(*pairs))
                np.add.at(matrix, concept_idx, self.vectors[rows])
                matrix /= np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
            index = VectorIndex(self.vectors.shape[1])
            index.add(np.arange(len(slot), dtype=np.int64), matrix)
            self._concept_indexes[target] = (list(slot), index, matrix)
        return self._concept_indexes[target]

    # --- serialization ------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write vectors and indexes: `vectors.npy` and `searcher.msgpack` (names, index data, a checksum)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with atomic_open(path / "vectors.npy") as f:
            np.save(f, self.vectors)
        write_msgpack(
            path / "searcher.msgpack",
            {
                "format": FORMAT_TAG,
                "version": FORMAT_VERSION,
                "row_names": self.row_names,
                "vectors_shape": list(self.vectors.shape),
                "vectors_crc32": zlib.crc32(self.vectors.tobytes()),
                "index_config": self.index_config,
                "indexes": {
                    source: {"data": index.to_bytes(), "removed": index.removed, "rows": _index_rows(self, source)}
                    for source, index in self.indexes.items()
                },
            },
        )

    def from_disk(self, path: str | Path) -> SieveSearcher:
        """Load what `to_disk` wrote; the vectors must match their checksum and the KB's names."""
        path = Path(path)
        data = read_msgpack(path / "searcher.msgpack", "searcher", FORMAT_TAG, FORMAT_VERSION)
        try:
            vectors = np.load(path / "vectors.npy", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise ConceptNormError(Errors.E004.format(path=path / "vectors.npy", detail=e)) from None
        if list(vectors.shape) != data["vectors_shape"] or zlib.crc32(vectors.tobytes()) != data["vectors_crc32"]:
            raise ConceptNormError(Errors.E302.format(path=path, detail="vectors.npy does not match its checksum"))
        self.vectors = vectors
        self.row_names = data["row_names"]
        self.rows = {name: i for i, name in enumerate(self.row_names) if name is not None}
        self._freed = {}
        missing = [n for n in self.kb.names() if n not in self.rows]
        if missing or len(self.rows) != len(self.kb.names()):
            raise ConceptNormError(
                Errors.E302.format(path=path, detail=f"the KB and the vectors differ (e.g. {missing[:3]})")
            )
        self.index_config = data["index_config"]
        self.indexes = {}
        for source, saved in data["indexes"].items():
            index = self._index(source)
            if saved["data"]:
                index.load_bytes(saved["data"], saved["removed"])
            else:  # flat: rebuild from the vectors
                rows = np.array(saved["rows"], dtype=np.int64)
                index.add(rows, self.vectors[rows])
        self._changed()
        return self


def _fetch(top_k: int) -> int:
    """Rows taken from an index per query before the exact scores rank them: a margin so that index scores,
    which depend on the batch of queries, cannot change which candidates come first."""
    return max(4 * top_k, 16)


def exact_scores(matrix: np.ndarray, rows: np.ndarray, query: np.ndarray) -> list[float]:
    """Cosines of one query with some rows, each computed the same way whatever the other rows and queries: float64
    products of the float32 values (exact) summed pairwise along the row. The scores a batched matrix product gives
    differ in the last bits with the batch's shape."""
    if not len(rows):
        return []
    return (matrix[rows].astype(np.float64) * query.astype(np.float64)).sum(axis=1).tolist()


def _without(match: Match, concepts: frozenset[str], top_k: int) -> Match:
    kept = [(c, n) for c, n in zip(match.candidates, match.names) if c[0] not in concepts][:top_k]
    return Match([c for c, _ in kept], [n for _, n in kept], match.stage)


def _index_rows(searcher: SieveSearcher, source: str) -> list[int]:
    """Rows indexed under a source (saved so flat indexes can be rebuilt exactly)."""
    return [searcher.rows[n] for n in searcher.kb.names(source) if n in searcher.rows]
