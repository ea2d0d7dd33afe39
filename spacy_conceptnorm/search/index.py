"""Vector indexes: inner product on unit vectors (= cosine), with int64 ids that can be added and removed at any
time, standalone or on the rows of a `vector_store.VectorStore`.

`VectorIndex` types:

- `exact`: exact search, one matrix product per block of rows and batch of queries, in torch (on the GPU when torch
  sees one). An index on a store (`VectorIndex.on_store`) keeps no vectors of its own, only which rows it holds;
  a standalone one keeps its own float32 matrix.
- `flat`: exact as well, with FAISS (`faiss.knn` over the store's blocks; standalone: `IndexFlatIP`, on the GPU
  when faiss-gpu sees one).
- `hnsw`: FAISS graph search; fast, approximate, no true removal (removed ids are filtered out of results until
  the next rebuild). On a store its graph keeps 8-bit codes (`IndexHNSWSQ`); standalone, float32 vectors.
- `ivf`: FAISS inverted lists, trained on the first vectors added, searched with `nprobe` lists. On a store the
  lists keep 8-bit codes (`IndexIVFScalarQuantizer`); standalone, float32 vectors (`IndexIVFFlat`).
- `ivfpq`: inverted lists of product-quantized codes (`IndexIVFPQ`, `pq_m` bytes per vector): the smallest, for
  KBs of millions of names.
- `auto`: chosen by `choose_index_type` from the number of vectors first added.

An approximate index on a store takes `refine` times the asked number of candidates from FAISS and ranks them by
their exact scores from the store, so its scores are exact cosines and only the candidates are approximate.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import torch

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open
from ..ml.threads import install_thread_settings
from .vector_store import BLOCK_ROWS, VectorStore, checksum_error, file_crc32

INDEX_TYPES = ("auto", "exact", "flat", "hnsw", "ivf", "ivfpq")
QUERY_CHUNK = 512  # queries per matrix product in exact search: bounds the score matrix to 512 x BLOCK_ROWS
SMALL_BATCH = 32  # fewer queries than this multiply float16 rows as they are: converting them costs more
ADD_CHUNK = 1 << 16  # vectors handed to FAISS at a time
IVF_MAX_LISTS = 4096  # lists chosen for IVF indexes (`ivf_nlist = 0`) at most
TRAIN_MIN = 65536  # vectors (at least) an approximate index is trained on, drawn at random from the first added
# `auto`: exact search up to EXACT_MAX_ROWS vectors, HNSW up to HNSW_MAX_ROWS, IVF-PQ beyond (measured: see
# docs/scale.md and docs/benchmarks.md)
EXACT_MAX_ROWS = 250_000
HNSW_MAX_ROWS = 1_000_000
# rows an approximate index rescores at a time: a float32 copy of a whole batch's candidates would take fresh memory
# whose page faults cost more than the products
RESCORE_ROWS = 4096
IVF_NPROBE, IVFPQ_NPROBE = 16, 64  # lists an IVF / IVF-PQ index visits per query unless `ivf_nprobe` is set


def _gpu_count() -> int:
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def choose_index_type(rows: int) -> str:
    """The index type `auto` stands for, given the number of vectors: exact search while it is fast enough,
    then HNSW, then IVF-PQ, the only one whose memory stays far below that of the vectors."""
    if rows <= EXACT_MAX_ROWS:
        return "exact"
    return "hnsw" if rows <= HNSW_MAX_ROWS else "ivfpq"


class VectorIndex:
    """A FAISS-style inner-product index with stable int64 ids.

    dim (int): Vector dimension.
    index_type (str): "exact", "flat", "hnsw", "ivf", "ivfpq", or "auto" (chosen from the number of vectors first
        added, see `choose_index_type`).
    hnsw_m (int): HNSW graph degree.
    hnsw_ef_search (int): HNSW search breadth (higher: slower, more exact).
    ivf_nlist (int): IVF lists; 0 picks about 4*sqrt(n), at most `IVF_MAX_LISTS`, at training time.
    ivf_nprobe (int): IVF lists visited per query; None: 16 for ivf, 64 for ivfpq (its codes are coarser, so it
        needs more lists for the same recall; see docs/scale.md).
    pq_m (int): IVF-PQ bytes per vector (sub-quantizers); the largest divisor of `dim` not above it is used.
    refine (int): On a store, an approximate index ranks `refine` times the asked candidates by exact score.
    """

    def __init__(
        self,
        dim: int,
        index_type: str = "exact",
        hnsw_m: int = 32,
        hnsw_ef_search: int = 128,
        ivf_nlist: int = 0,
        ivf_nprobe: int | None = None,
        pq_m: int = 48,
        refine: int = 4,
    ) -> None:
        if index_type not in INDEX_TYPES:
            raise ConceptNormError(Errors.E103.format(index_type=index_type, choices=INDEX_TYPES))
        self.dim = dim
        self.index_type = index_type
        self.hnsw_m, self.hnsw_ef_search = hnsw_m, hnsw_ef_search
        self.ivf_nlist, self.ivf_nprobe = ivf_nlist, ivf_nprobe
        self.pq_m, self.refine = pq_m, refine
        self.store: VectorStore | None = None
        self._removed: set[int] = set()  # hnsw only
        self._index = None
        self._gpu_index = None
        install_thread_settings()  # FAISS and torch (the exact index) hang in forked workers otherwise

    @classmethod
    def on_store(cls, store: VectorStore, **config) -> VectorIndex:
        """An index whose ids are rows of `store`: exact types search the store itself (no copy of the vectors),
        approximate ones keep compact codes and rank their candidates by exact scores from the store."""
        index = cls(store.dim, **config)
        index.store = store
        return index

    def _new_index(self, n: int, sample: np.ndarray):
        """The FAISS (or torch) index of this type for `n` vectors, trained on `sample` (some of them, float32)
        where its type needs training."""
        if self.index_type == "auto":
            self.index_type = choose_index_type(n)
        shared = self.store is not None
        if self.index_type in ("exact", "flat"):
            if shared:
                return _StoreIndex(self.store, "torch" if self.index_type == "exact" else "faiss")
            if self.index_type == "exact":
                return _ExactIndex(self.dim)
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        ip = faiss.METRIC_INNER_PRODUCT
        if self.index_type == "hnsw":
            if shared:
                hnsw = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit, self.hnsw_m, ip)
                hnsw.train(sample)
            else:
                hnsw = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, ip)
            hnsw.hnsw.efSearch = self.hnsw_ef_search
            return faiss.IndexIDMap2(hnsw)
        nlist = self._nlist(n)
        quantizer = faiss.IndexFlatIP(self.dim)
        if self.index_type == "ivfpq" and len(sample) >= 4:
            m = max(d for d in range(1, min(self.pq_m, self.dim) + 1) if self.dim % d == 0)
            nbits = int(min(8, np.log2(len(sample) / 2)))  # k-means needs more vectors than centroids
            index = faiss.IndexIVFPQ(quantizer, self.dim, nlist, m, nbits, ip)
        elif shared:  # ivf, or ivfpq with too few vectors to train its codebooks
            index = faiss.IndexIVFScalarQuantizer(quantizer, self.dim, nlist, faiss.ScalarQuantizer.QT_8bit, ip)
        else:
            index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, ip)
        index.own_fields = True
        quantizer.this.disown()
        index.train(sample)
        index.nprobe = self.nprobe
        return index

    def _training_size(self, n: int) -> int:
        """Vectors to train on: IVF k-means wants about 39 per list (FAISS warns below), PQ and 8-bit codes a few
        tens of thousands."""
        return max(self._nlist(n) * 39, TRAIN_MIN)

    def _nlist(self, n: int) -> int:
        """IVF lists: `ivf_nlist`, else about 4 sqrt(n), at most `IVF_MAX_LISTS` (training and assigning cost
        grow with the lists) and at least 39 vectors per list."""
        return self.ivf_nlist or max(1, min(n // 39, int(4 * np.sqrt(n)), IVF_MAX_LISTS))

    def __len__(self) -> int:
        return 0 if self._index is None else self._index.ntotal - len(self._removed)

    def add(self, ids: np.ndarray, vectors: np.ndarray | None = None) -> None:
        """Add vectors under ids; on a store, ids are rows and `vectors` may be left out (read from the store, a
        block at a time, when the index keeps codes of its own)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if vectors is None and self.store is None:
            raise ConceptNormError(Errors.E107.format(rows=len(ids)))
        if vectors is not None:
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[1] != self.dim:
                raise ConceptNormError(Errors.E104.format(expected=self.dim, found=vectors.shape[-1]))
            if len(vectors) != len(ids):
                raise ConceptNormError(Errors.E106.format(vectors=len(vectors), ids=len(ids)))
        if not len(ids):
            return
        if self._index is None:
            size = self._training_size(len(ids))
            picked = None
            if len(ids) > size:  # a random sample, in order
                picked = np.sort(np.random.default_rng(0).choice(len(ids), size, replace=False))
            if vectors is not None:
                sample = vectors if picked is None else vectors[picked]
            elif self.index_type in ("exact", "flat") or (self.index_type == "auto" and len(ids) <= EXACT_MAX_ROWS):
                sample = np.zeros((0, self.dim), dtype=np.float32)  # an exact index on a store trains nothing
            else:
                sample = self.store[ids if picked is None else ids[picked]]
            self._index = self._new_index(len(ids), sample)
        self._removed.difference_update(ids.tolist())
        if isinstance(self._index, _StoreIndex):
            self._index.add_with_ids(None, ids)
        else:
            for start in range(0, len(ids), ADD_CHUNK):  # FAISS copies what it is given: bound the copies
                chunk = ids[start : start + ADD_CHUNK]
                given = vectors[start : start + ADD_CHUNK] if vectors is not None else self.store[chunk]
                self._index.add_with_ids(given, chunk)
        self._gpu_index = None

    def remove(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if self._index is None or not len(ids):
            return
        if self.index_type == "hnsw":
            self._removed.update(ids.tolist())
        else:
            self._index.remove_ids(ids)
        self._gpu_index = None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) per query, best first; id -1 pads rows with fewer than k results."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n = len(queries)
        if self._index is None or len(self) == 0 or n == 0:
            return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)
        approximate = self.store is not None and not isinstance(self._index, _StoreIndex)
        wanted = k * self.refine if approximate else k
        fetch = min(wanted + len(self._removed), self._index.ntotal)
        scores, ids = self._searcher().search(queries, fetch)
        if self._removed:
            keep = ~np.isin(ids, list(self._removed))
            scores = np.where(keep, scores, -np.inf)
            order = np.argsort(-scores, axis=1, kind="stable")
            scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(np.where(keep, ids, -1), order, 1)
        if approximate:
            scores, ids = self._rescored(queries, ids)
        if ids.shape[1] < k:
            pad = k - ids.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        return scores[:, :k], ids[:, :k]

    def _rescored(self, queries: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates `ids` (-1: none) ranked by their exact scores from the store."""
        found = ids >= 0
        rows = np.where(found, ids, 0)
        scores = np.empty(ids.shape, dtype=np.float32)
        step = max(1, RESCORE_ROWS // max(1, ids.shape[1]))
        for s in range(0, len(ids), step):  # a few queries at a time: see RESCORE_ROWS
            vectors = self.store[rows[s : s + step].ravel()].reshape(-1, ids.shape[1], self.dim)
            scores[s : s + step] = np.einsum("qkd,qd->qk", vectors, queries[s : s + step])
        scores = np.where(found, scores, -np.inf)
        order = np.argsort(-scores, axis=1, kind="stable")
        return np.take_along_axis(scores, order, 1), np.take_along_axis(np.where(found, ids, -1), order, 1)

    def _searcher(self):
        if self.index_type != "flat" or self.store is not None or _gpu_count() == 0:
            return self._index
        if self._gpu_index is None:
            self._gpu_resources = faiss.StandardGpuResources()
            self._gpu_index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self._index)
        return self._gpu_index

    @property
    def saves_data(self) -> bool:
        """Whether the index holds data of its own to save (exact and flat indexes are rebuilt from vectors)."""
        return self._index is not None and self.index_type not in ("exact", "flat")

    def to_bytes(self) -> bytes:
        """The serialized FAISS index (empty for exact and flat indexes, which are rebuilt from their vectors)."""
        return faiss.serialize_index(self._index).tobytes() if self.saves_data else b""

    def load_bytes(self, data: bytes, removed: list[int]) -> None:
        if data:
            self._set(faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8)))
        self._removed = set(removed)
        self._gpu_index = None

    def write(self, path: str | Path) -> int:
        """Write the FAISS index to a file (atomically, streamed); returns its crc32."""
        crc = 0

        def write(data: bytes) -> None:
            nonlocal crc
            crc = zlib.crc32(data, crc)
            f.write(data)

        with atomic_open(path) as f:
            faiss.write_index(self._index, faiss.PyCallbackIOWriter(write))
        return crc

    def read(self, path: str | Path, removed: list[int], crc32: int | None = None) -> None:
        """Read an index written by `write`; with `crc32`, the file must match it."""
        path = Path(path)
        if not path.exists():
            raise ConceptNormError(Errors.E002.format(path=path))
        if crc32 is not None and file_crc32(path, 0) != crc32:
            raise checksum_error(path)
        try:
            self._set(faiss.read_index(str(path)))
        except RuntimeError as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=str(e).strip().splitlines()[-1])) from None
        self._removed = set(removed)
        self._gpu_index = None

    def set_search_breadth(self, ivf_nprobe: int | None = None, hnsw_ef_search: int | None = None) -> None:
        """Search a built index wider or narrower, without rebuilding it: recall for speed.

        ivf_nprobe (Optional[int]): IVF lists visited per query (ivf, ivfpq); None leaves it.
        hnsw_ef_search (Optional[int]): HNSW search breadth (hnsw); None leaves it.
        """
        if ivf_nprobe is not None:
            self.ivf_nprobe = ivf_nprobe
        if hnsw_ef_search is not None:
            self.hnsw_ef_search = hnsw_ef_search
        if self._index is not None and not isinstance(self._index, (_StoreIndex, _ExactIndex)):
            self._set(self._index)  # FAISS's own settings

    def _set(self, index) -> None:
        """Take a deserialized FAISS index, with this index's search settings."""
        self._index = index
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = self.nprobe
        inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else None
        if isinstance(inner, faiss.IndexHNSW):
            inner.hnsw.efSearch = self.hnsw_ef_search

    @property
    def nprobe(self) -> int:
        """IVF lists visited per query: `ivf_nprobe`, else the type's default."""
        if self.ivf_nprobe is not None:
            return self.ivf_nprobe
        return IVFPQ_NPROBE if self.index_type == "ivfpq" else IVF_NPROBE

    @property
    def removed(self) -> list[int]:
        return sorted(self._removed)

    def config(self) -> dict:
        return {
            "index_type": self.index_type,
            "hnsw_m": self.hnsw_m,
            "hnsw_ef_search": self.hnsw_ef_search,
            "ivf_nlist": self.ivf_nlist,
            "ivf_nprobe": self.ivf_nprobe,
            "pq_m": self.pq_m,
            "refine": self.refine,
        }

    def nbytes(self) -> int:
        """Bytes of the index's own data (0 for an exact index on a store, which holds only its row set)."""
        if self._index is None:
            return 0
        if isinstance(self._index, (_StoreIndex, _ExactIndex)):
            return self._index.nbytes()
        size = 0

        def count(data: bytes) -> None:
            nonlocal size
            size += len(data)

        faiss.write_index(self._index, faiss.PyCallbackIOWriter(count))
        return size


class _StoreIndex:
    """Exact search over the rows of a `VectorStore` that are members, in the FAISS calling convention
    (`ntotal`, `add_with_ids`, `remove_ids`, `search`), a block of rows at a time: a slice of the store with
    non-members masked out where most rows of the span are members, else the member rows gathered.

    engine (str): "torch" (matrix products; on the GPU when torch sees one, over a float16 copy there; on the CPU
        float16 blocks are multiplied as they are for fewer than `SMALL_BATCH` queries, else converted once for all
        queries) or "faiss" (`faiss.knn` over float32 blocks).
    """

    def __init__(self, store: VectorStore, engine: str) -> None:
        self.store = store
        self.engine = engine
        self.member = np.zeros(0, dtype=bool)
        self.ntotal = 0
        self._members: np.ndarray | None = None  # the member rows, ascending (cached)
        self.device = "cuda" if engine == "torch" and torch.cuda.is_available() else "cpu"
        self._device_copy: tuple[int, torch.Tensor] | None = None

    def add_with_ids(self, vectors: None, ids: np.ndarray) -> None:
        if len(ids) and ids.max() >= len(self.member):
            grown = np.zeros(max(len(self.store), int(ids.max()) + 1), dtype=bool)
            grown[: len(self.member)] = self.member
            self.member = grown
        self.member[ids] = True
        self._changed()

    def remove_ids(self, ids: np.ndarray) -> None:
        ids = ids[(ids >= 0) & (ids < len(self.member))]
        self.member[ids] = False
        self._changed()

    def _changed(self) -> None:
        self._members = np.flatnonzero(self.member)
        self.ntotal = len(self._members)

    def nbytes(self) -> int:
        return self.member.nbytes + self._members.nbytes

    def _blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """(store rows, their vectors as stored, which of them are members or None for all) per block."""
        members = self._members
        if not len(members):
            return
        first, last = int(members[0]), int(members[-1]) + 1
        if 2 * len(members) >= last - first:  # dense: slices of the store, non-members masked
            for start in range(first, last, BLOCK_ROWS):
                end = min(start + BLOCK_ROWS, last)
                keep = self.member[start:end]
                yield np.arange(start, end), self.store.raw(slice(start, end)), None if keep.all() else keep
        else:
            for start in range(0, len(members), BLOCK_ROWS):
                rows = members[start : start + BLOCK_ROWS]
                yield rows, self.store.raw(rows), None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.device != "cpu":
            return self._search_device(queries, k)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        for rows, block, keep in self._blocks():
            if self.engine == "faiss" or len(queries) >= SMALL_BATCH or block.dtype != np.float16:
                if keep is not None and self.engine == "faiss":
                    rows, block, keep = rows[keep], block[keep], None
                block = np.asarray(block, dtype=np.float32)
            for q in range(0, len(queries), QUERY_CHUNK):
                chunk = slice(q, q + QUERY_CHUNK)
                top_scores, top_rows = self._block_top(queries[chunk], block, keep, min(k, len(block)))
                found = np.where(top_rows >= 0, rows[np.maximum(top_rows, 0)], -1)
                scores[chunk], ids[chunk] = _merge(scores[chunk], ids[chunk], top_scores, found, k)
        return scores, ids

    def _block_top(
        self, queries: np.ndarray, block: np.ndarray, keep: np.ndarray | None, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.engine == "faiss":
            return faiss.knn(queries, block, k, metric=faiss.METRIC_INNER_PRODUCT)
        with torch.inference_mode():
            matrix = torch.from_numpy(block)
            products = torch.from_numpy(queries).to(matrix.dtype) @ matrix.T
            if keep is not None:
                products.masked_fill_(~torch.from_numpy(keep), -torch.inf)
            top = products.float().topk(k, dim=1)
        values, rows = top.values.numpy(), top.indices.numpy().astype(np.int64)
        return values, np.where(np.isfinite(values), rows, -1)

    def _search_device(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The whole store as float16 on the GPU (copied again when it changes), non-members masked out."""
        if self._device_copy is None or self._device_copy[0] != self.store.version:
            rows = [torch.from_numpy(block).half() for _, block in self.store.blocks()]
            matrix = torch.cat(rows).to(self.device) if rows else torch.zeros((0, self.store.dim)).half()
            self._device_copy = (self.store.version, matrix)
        matrix = self._device_copy[1]
        mask = torch.from_numpy(~self.member[: len(matrix)]).to(self.device)
        out_scores, out_ids = [], []
        with torch.inference_mode():
            for q in range(0, len(queries), QUERY_CHUNK):
                chunk = torch.from_numpy(queries[q : q + QUERY_CHUNK]).to(self.device).half()
                scores = (chunk @ matrix[: len(mask)].T).float().masked_fill(mask, -torch.inf)
                top = scores.topk(min(k, scores.shape[1]), dim=1)
                out_scores.append(top.values.cpu().numpy())
                out_ids.append(top.indices.cpu().numpy().astype(np.int64))
        scores, ids = np.concatenate(out_scores), np.concatenate(out_ids)
        ids = np.where(np.isfinite(scores), ids, -1)
        if ids.shape[1] < k:
            pad = k - ids.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        return scores, ids


def _merge(scores: np.ndarray, ids: np.ndarray, more_scores: np.ndarray, more_ids: np.ndarray, k: int):
    """The k best of two (scores, ids) sets per row, best first; earlier entries first among equal scores."""
    scores = np.concatenate([scores, more_scores], axis=1)
    ids = np.concatenate([ids, more_ids], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


class _ExactIndex:
    """Exact inner-product search with torch over a float32 matrix of its own, in the FAISS calling convention
    (`ntotal`, `add_with_ids`, `remove_ids`, `search`)."""

    def __init__(self, dim: int) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.ids = np.zeros(0, dtype=np.int64)
        self.matrix = torch.zeros((0, dim), dtype=torch.float32, device=self.device)

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        return self.matrix.numel() * 4 + self.ids.nbytes

    def add_with_ids(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        self.matrix = torch.cat([self.matrix, torch.from_numpy(vectors).to(self.device)])
        self.ids = np.concatenate([self.ids, ids])

    def remove_ids(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self.ids, ids)
        self.ids = self.ids[keep]
        self.matrix = self.matrix[torch.from_numpy(keep).to(self.device)]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = [], []
        with torch.inference_mode():
            for start in range(0, len(queries), QUERY_CHUNK):
                chunk = torch.from_numpy(queries[start : start + QUERY_CHUNK]).to(self.device)
                top = (chunk @ self.matrix.T).topk(k, dim=1)
                scores.append(top.values.cpu().numpy())
                rows.append(top.indices.cpu().numpy())
        return np.concatenate(scores), self.ids[np.concatenate(rows)]
