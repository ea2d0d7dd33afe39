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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConceptNormError, Errors
from ..io.files import read_msgpack, write_msgpack
from ..kb.knowledge_base import DOMAIN, ONTOLOGY, KnowledgeBase
from ..ml.name_encoder import NameEncoder
from .index import VectorIndex
from .rows import RowNames, Rows, RowTable
from .vector_store import VectorStore

TARGET_BITS = {"O": 1, "D": 2, "OD": 3}
TARGET_SOURCES = {"O": (ONTOLOGY,), "D": (DOMAIN,), "OD": (ONTOLOGY, DOMAIN)}
FORMAT_TAG, FORMAT_VERSION = "spacy_conceptnorm.searcher", 2
ENCODE_CHUNK = 100_000  # names per encoder call when building: bounds the float32 vectors held at once
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
    """Name vectors, their indexes per source, and the sieve search over them.

    The vectors are one `VectorStore` (float16 where that keeps cosines to float32 >= 0.999; memory-mapped when
    loaded) shared by every index: an exact index keeps only which rows it holds. Which row holds which name is
    a `RowTable` over the knowledge base's name ids (`rows`, `row_names` are views of it).

    kb (KnowledgeBase): The concepts and names searched.
    encoder (NameEncoder): Encodes names and queries.
    strategy (str): Stages joined by "+", e.g. "D-T+OD-T" (see `ALL_STRATEGIES`).
    threshold (float): A stage before the last answers only when its best cosine reaches this.
    top_k (int): Candidates returned per query.
    index (dict): `VectorIndex` settings (`index_type`: auto, exact, flat, hnsw, ivf, ivfpq, and their
        parameters); `auto` (the default) picks a type per source from its number of names.
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
        self.vectors = VectorStore(0)  # its dimension is the encoder's, known once names are encoded
        self.row_table = RowTable(kb)
        self.indexes: dict[str, VectorIndex] = {}
        self._concept_indexes: dict[str, tuple[list[str], VectorIndex, np.ndarray]] = {}
        self._canonical: dict[str, str] = {}
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

    @property
    def rows(self) -> Mapping[str, int]:
        """Normalized name -> its row of `vectors` (a view)."""
        return Rows(self.row_table)

    @property
    def row_names(self) -> Sequence[str | None]:
        """Row -> its normalized name, None for a free row (a view)."""
        return RowNames(self.row_table)

    @property
    def row_name_ids(self) -> np.ndarray:
        """Row -> the KB id of its normalized name (`kb.name_key`), -1 for a free row. Read only: it is the
        searcher's own array. Name ids are never reused, so equal ids mean equal names."""
        return self.row_table.row_name

    @property
    def name_rows(self) -> np.ndarray:
        """KB name id -> its row, -1 for none (ids beyond its length have none). Read only: the searcher's own
        array, the inverse of `row_name_ids`."""
        return self.row_table.name_row

    # --- building and changing ----------------------------------------------------------------------------------
    def build(self, progress: bool = False, vectors: VectorStore | np.ndarray | None = None) -> None:
        """Encode every name of the knowledge base (`ENCODE_CHUNK` names at a time, into one store) and index it
        under its sources.

        vectors (VectorStore | np.ndarray): The names' vectors, one row per name of `kb.names()` in order, to use
            instead of encoding them (vectors made elsewhere, e.g. on a GPU machine).
        """
        ids = self.kb.name_ids()
        if vectors is None:
            vectors = self._encoded(ids, progress)
        elif not isinstance(vectors, VectorStore):
            array = np.asarray(vectors, dtype=np.float32)
            vectors = VectorStore(array.shape[1])
            vectors.append(array)
        if len(vectors) != len(ids):
            raise ConceptNormError(Errors.E108.format(expected=len(ids), found=len(vectors)))
        self.vectors = vectors
        self.row_table.reset(ids.copy())
        self.indexes = {}
        for source in (ONTOLOGY, DOMAIN):
            self._index(source).add(self.name_rows[self.kb.name_ids(source)])
        self._changed()

    def _encoded(self, ids: np.ndarray, progress: bool) -> VectorStore:
        store = None
        for start in range(0, max(len(ids), 1), ENCODE_CHUNK):
            names = [self.kb.name_key(i) for i in ids[start : start + ENCODE_CHUNK]]
            encoded = np.asarray(self.encoder.encode(names, progress=progress), dtype=np.float32)
            if store is None:
                store = VectorStore(encoded.shape[1] if encoded.ndim == 2 else self.vectors.dim)
                store.reserve(len(ids))
            if len(names):
                store.append(encoded)
        return store

    def _index(self, source: str) -> VectorIndex:
        if source not in self.indexes:
            self.indexes[source] = VectorIndex.on_store(self.vectors, **{"index_type": "auto", **self.index_config})
        return self.indexes[source]

    def add_names(self, names: Iterable[str], source: str) -> None:
        """Index normalized names (already linked in the KB) under `source`, encoding those not seen before. New
        names take the rows freed by removed names first, so adding and removing names does not grow `vectors`."""
        names = list(dict.fromkeys(names))
        if not names:
            return
        table = self.row_table
        table.restore(names, len(self.vectors))  # removed earlier and its row still free: its vector is still there
        unseen = [n for n in names if table.row_of(n) < 0]
        if unseen:
            new = np.asarray(self.encoder.encode(unseen), dtype=np.float32)
            held = [np.asarray(index.removed) for index in self.indexes.values() if index.removed]
            free = table.free_rows(held)[: len(unseen)]
            table.take(free)
            if len(self.vectors) == 0 and self.vectors.dim != new.shape[1]:
                self.vectors = VectorStore(new.shape[1])
                self.indexes = {}
            if free:
                self.vectors[free] = new[: len(free)]
            rows = free + self.vectors.append(new[len(free) :]).tolist()
            for row, name in zip(rows, unseen):
                table.assign(row, name, len(self.vectors))
        self._index(source).add(np.array([table.row_of(n) for n in names], dtype=np.int64))
        self._changed()

    def remove_names(self, names: Iterable[str], source: str) -> None:
        """Drop normalized names that no longer have any concept under `source` from that source's index."""
        found = [(n, r) for n in names if (r := self.row_table.row_of(n)) >= 0]
        if not found:
            return
        if source in self.indexes:
            self.indexes[source].remove(np.array([r for _, r in found], dtype=np.int64))
        for name, _ in found:
            if not self.kb.concepts_for(name):  # gone from the KB entirely: free its row
                self.row_table.release(name)
        self._changed()

    def _changed(self) -> None:
        self._concept_indexes.clear()
        self._canonical = {}

    # --- searching ----------------------------------------------------------------------------------------------
    def query_vectors(self, keys: Sequence[str]) -> np.ndarray:
        """Vectors for normalized queries: a query equal to a known name reuses its vector (the same text gives
        the same vector), the others are encoded, each distinct text once."""
        out = np.zeros((len(keys), self.vectors.dim), dtype=np.float32)
        known: dict[int, int] = {}
        todo: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            row = self.row_table.row_of(key)
            if row >= 0:
                known[i] = row
            else:
                todo.setdefault(key, []).append(i)
        if known:
            out[list(known)] = self.vectors[np.array(list(known.values()), dtype=np.int64)]
        if todo:  # an encoder with `encode_queries` gives each text bits that do not depend on the batch
            encoded = getattr(self.encoder, "encode_queries", self.encoder.encode)(list(todo))
            if len(self.vectors) == 0 and out.shape[1] != np.shape(encoded)[1]:
                out = np.zeros((len(keys), np.shape(encoded)[1]), dtype=np.float32)
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
        the queries' `query_vectors`, saves encoding them again). A query that is a known name is searched like
        any other, with its stored vector: its answer lists its nearest other concepts too, and an earlier stage
        may answer it from a name of another concept."""
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
        hits = [self.indexes[source].search(queries, _fetch(top_k))[1] for source in sources]
        found = [list(dict.fromkeys(r for ids in hits for r in ids[q].tolist() if r >= 0)) for q in range(len(queries))]
        # the rows of every query are scored in one pass, and each name's concepts looked up once for the batch
        # rather than once per query that found it
        rows = np.array([r for q_rows in found for r in q_rows], dtype=np.int64)
        query_of = np.repeat(np.arange(len(queries)), [len(f) for f in found])
        scores = [
            score
            for s in range(0, len(rows), SCORE_CHUNK)
            for score in exact_scores(self.vectors, rows[s : s + SCORE_CHUNK], queries[query_of[s : s + SCORE_CHUNK]])
        ]
        name_ids = self.row_name_ids[rows].tolist() if len(rows) else []
        names = {n: (self.kb.name_key(n), self.kb.concepts_of(n, mask)) for n in set(name_ids) if n >= 0}
        matches, start = [], 0
        for q_rows in found:
            best: dict[str, tuple[float, str]] = {}
            for name_id, score in zip(name_ids[start : start + len(q_rows)], scores[start : start + len(q_rows)]):
                if name_id < 0:
                    continue
                name, concepts = names[name_id]
                for cid in concepts:
                    if cid not in best or score > best[cid][0]:
                        best[cid] = (score, name)
            start += len(q_rows)
            matches.append(self._rank(best, stage, top_k))
        return matches

    def _search_concepts(self, stage: Stage, queries: np.ndarray, top_k: int) -> list[Match]:
        concept_ids, index, matrix = self._concept_index(stage.target)
        _, ids = index.search(queries, _fetch(top_k))
        matches = []
        for q, found in enumerate(ids):
            found = found[found >= 0]
            scores = exact_scores(matrix, found, queries[q])
            best = {concept_ids[j]: (score, self._canonical_key(concept_ids[j])) for j, score in zip(found, scores)}
            matches.append(self._rank(best, stage, top_k))
        return matches

    def _rank(self, best: dict[str, tuple[float, str]], stage: Stage, top_k: int) -> Match:
        key = self._canonical_key
        order = sorted(best, key=lambda c: (-round(best[c][0], 5), key(c) != best[c][1], c))[:top_k]
        return Match([(c, best[c][0]) for c in order], [self.kb.surface(best[c][1]) for c in order], str(stage))

    def _canonical_key(self, concept_id: str) -> str:
        """The normalized canonical name of a concept (cached for the concepts met)."""
        found = self._canonical.get(concept_id)
        if found is None:
            found = self._canonical[concept_id] = self.kb.canonical_key(concept_id)
        return found

    def _concept_index(self, target: str) -> tuple[list[str], VectorIndex, np.ndarray]:
        """Concept vectors for a target: the mean of the vectors of each concept's names there, re-normalized
        (a float32 matrix of its own, one row per concept: for KBs of up to a few hundred thousand concepts)."""
        if target not in self._concept_indexes:
            mask = TARGET_BITS[target]
            slot: dict[str, int] = {}
            pairs = [
                (slot.setdefault(cid, len(slot)), row)
                for row, name_id in enumerate(self.row_name_ids.tolist())
                if name_id >= 0
                for cid in self.kb.concepts_of(name_id, mask)
            ]
            matrix = np.zeros((len(slot), self.vectors.dim), dtype=np.float32)
            if pairs:
                concept_idx, rows = map(np.array, zip(*pairs))
                np.add.at(matrix, concept_idx, self.vectors[rows])
                matrix /= np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
            index = VectorIndex(self.vectors.dim)
            index.add(np.arange(len(slot), dtype=np.int64), matrix)
            self._concept_indexes[target] = (list(slot), index, matrix)
        return self._concept_indexes[target]

    # --- serialization ------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write `vectors.npy` (the store, a block at a time), a FAISS file per approximate index, and
        `searcher.msgpack` (each row's KB name id, a checksum of the KB's names, the files' crc32)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        crc = self.vectors.save(path / "vectors.npy")
        indexes = {}
        for source, index in self.indexes.items():
            saved = {"index_type": index.index_type, "removed": index.removed}
            if index.saves_data:
                saved["file"] = f"{source}.faiss"
                saved["crc32"] = index.write(path / saved["file"])
            indexes[source] = saved
        write_msgpack(
            path / "searcher.msgpack",
            {
                "format": FORMAT_TAG,
                "version": FORMAT_VERSION,
                "vectors_shape": list(self.vectors.shape),
                "vectors_crc32": crc,
                "row_name_ids": self.row_name_ids.astype("<i8").tobytes(),
                "kb_names_crc32": self.kb.names_digest(),
                "index_config": self.index_config,
                "indexes": indexes,
            },
        )

    def from_disk(self, path: str | Path) -> SieveSearcher:
        """Load what `to_disk` wrote; the vectors are memory-mapped and must match their checksum (read once, a
        block at a time), and the rows the KB's names."""
        path = Path(path)
        data = read_msgpack(path / "searcher.msgpack", "searcher", FORMAT_TAG, FORMAT_VERSION)
        vectors = VectorStore.load(path / "vectors.npy", tuple(data["vectors_shape"]), data["vectors_crc32"])
        if data["kb_names_crc32"] != self.kb.names_digest():
            detail = "the KB and the vectors differ (the KB's names are not those they were saved with)"
            raise ConceptNormError(Errors.E302.format(path=path, detail=detail))
        row_name = np.frombuffer(data["row_name_ids"], dtype="<i8").astype(np.int64)
        if len(row_name) != len(vectors) or (len(row_name) and row_name.max() >= self.kb.name_capacity):
            raise ConceptNormError(Errors.E302.format(path=path, detail="the rows do not fit the vectors and the KB"))
        self.vectors = vectors
        self.row_table.reset(row_name)
        alive = self.kb.name_ids()
        unmatched = alive[self.name_rows[alive] < 0]
        if len(unmatched) or (row_name >= 0).sum() != len(alive):
            missing = [self.kb.name_key(i) for i in unmatched[:3]]
            raise ConceptNormError(
                Errors.E302.format(path=path, detail=f"the KB and the vectors differ (e.g. {missing})")
            )
        self.index_config = data["index_config"]
        self.indexes = {}
        for source, saved in data["indexes"].items():
            config = {**self.index_config, "index_type": saved["index_type"]}
            index = self.indexes[source] = VectorIndex.on_store(self.vectors, **config)
            if saved.get("file"):
                index.read(path / saved["file"], saved["removed"], saved["crc32"])
            else:  # exact or flat: the rows of the KB's names under this source
                index.add(self.name_rows[self.kb.name_ids(source)])
        self._changed()
        return self


# rows scored at a time: a float64 copy of all of a batch's rows (`_fetch(top_k)` per query and source) would take
# fresh memory whose page faults cost more than the products
SCORE_CHUNK = 4096


def _fetch(top_k: int) -> int:
    """Rows taken from an index per query before the exact scores rank them: a margin so that index scores,
    which depend on the batch of queries, cannot change which candidates come first."""
    return max(4 * top_k, 16)


def exact_scores(matrix: np.ndarray | VectorStore, rows: np.ndarray, query: np.ndarray) -> list[float]:
    """Cosines of a query (1-d) with some rows, or of each row with its own query (2-d, one per row), each computed
    the same way whatever the other rows and queries: float64 products of the float32 values (exact) summed
    pairwise along the row, divided by both norms (so a float16 row scores exactly 1 against itself). The scores a
    batched matrix product gives differ in the last bits with the batch's shape."""
    if not len(rows):
        return []
    vectors = matrix[rows].astype(np.float64)
    query = query.astype(np.float64)
    # sqrt(a * b), not sqrt(a) * sqrt(b): for a row against itself a = b = the dot product, and sqrt(a * a) == a
    # exactly in IEEE arithmetic, so the cosine is exactly 1 (the product of two square roots may miss by an ulp)
    norms = np.sqrt((vectors * vectors).sum(axis=1) * (query * query).sum(axis=-1))
    return ((vectors * query).sum(axis=1) / np.where(norms > 0, norms, 1.0)).tolist()


def _without(match: Match, concepts: frozenset[str], top_k: int) -> Match:
    kept = [(c, n) for c, n in zip(match.candidates, match.names) if c[0] not in concepts][:top_k]
    return Match([c for c, _ in kept], [n for _, n in kept], match.stage)
