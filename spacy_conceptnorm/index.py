"""Vectors and vector indexes: inner product on unit vectors (= cosine), with int64 ids that can be added and
removed at any time.

`VectorStore` holds the name vectors once, for the searcher and its indexes: float16 while every row keeps a cosine
of at least `FP16_MIN_COSINE` to its float32 value (else float32), in memory or memory-mapped from a saved `.npy`.

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

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import torch

from .errors import ConceptNormError, Errors
from .threads import install_thread_settings
from .util import atomic_open

INDEX_TYPES = ("auto", "exact", "flat", "hnsw", "ivf", "ivfpq")
QUERY_CHUNK = 512  # queries per matrix product in exact search: bounds the score matrix to 512 x BLOCK_ROWS
BLOCK_ROWS = 16384  # store rows searched (converted to float32) at a time
FILE_READ_BYTES = 256 * 2**20  # loaded vectors this large are read from their file, not through the memory map
SMALL_BATCH = 32  # fewer queries than this multiply float16 rows as they are: converting them costs more
ADD_CHUNK = 1 << 16  # vectors handed to FAISS at a time
IVF_MAX_LISTS = 4096  # lists chosen for IVF indexes (`ivf_nlist = 0`) at most
TRAIN_MIN = 65536  # vectors (at least) an approximate index is trained on, drawn at random from the first added
FP16_MIN_COSINE = 0.999  # float16 storage while every row keeps this cosine to its float32 value
# `auto`: exact search up to EXACT_MAX_ROWS vectors, HNSW up to HNSW_MAX_ROWS, IVF-PQ beyond (see
# benchmarks/scale.py and the README, "Large knowledge bases", for the measurements behind them)
EXACT_MAX_ROWS = 250_000
HNSW_MAX_ROWS = 1_000_000
# rows an approximate index rescores at a time: a float32 copy of all of a batch's candidates (320 rows a query
# when 80 are asked) took fresh memory whose page faults cost more than the products (0.124-0.143 s -> 0.087 s for 167
# NCBI-disease test queries)
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


class VectorStore:
    """Row vectors, read as float32, stored as float16 while every row keeps a cosine of at least
    `FP16_MIN_COSINE` to the float32 value it was given (else float32 from then on).

    Rows loaded from disk (`load`) are memory-mapped copy-on-write: read from the file as needed, and a row
    written afterwards stays in memory, the file unchanged. Rows appended after loading are kept in memory.

    dim (int): Vector dimension.
    dtype (np.dtype): float16 (default) or float32.
    """

    def __init__(self, dim: int, dtype: np.dtype | type = np.float16) -> None:
        self.dim = int(dim)
        self._base = np.zeros((0, self.dim), dtype=dtype)  # loaded (memory-mapped) rows, or rows reserved
        self._tail = np.zeros((0, self.dim), dtype=dtype)  # rows appended after them, with spare capacity
        self._tail_rows = 0
        self.version = 0  # changes with every write: copies elsewhere (a GPU) follow it
        self._file = None  # the loaded .npy, open (its rows are read from it), and where its data start
        self._offset = 0
        self._base_written = False  # a loaded row was written: the map holds it, the file does not

    def __getstate__(self) -> dict:
        """Pickled with its rows (a memory map pickles as an array), without the open file."""
        return {**self.__dict__, "_file": None}

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), self.dim)

    def __len__(self) -> int:
        return len(self._base) + self._tail_rows

    @property
    def nbytes(self) -> int:
        return len(self) * self.dim * self.dtype.itemsize

    def __getitem__(self, key: int | slice | np.ndarray) -> np.ndarray:
        """float32 rows: one (1-d) for an integer, else a 2-d array."""
        rows = self.raw(key)
        if rows.dtype == np.float16 and rows.flags.writeable and rows.flags.c_contiguous and rows.size > 4096:
            # the same values (float16 -> float32 is exact) by torch's vectorized kernel: 25 blocks of 4,096 MEDIC
            # rows took numpy 0.058-0.074 s, torch 0.009-0.012 s
            import torch

            return torch.from_numpy(rows).float().numpy()
        return np.asarray(rows, dtype=np.float32)

    def raw(self, key: int | slice | np.ndarray) -> np.ndarray:
        """Rows as stored (float16 or float32): one (1-d) for an integer, else a 2-d array, a view of the store
        for a run of consecutive rows."""
        n = len(self._base)
        if isinstance(key, (int, np.integer)):
            row = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} of a store of {len(self)} rows")
            return self._base[row] if row < n else self._tail[row - n]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1 and (stop <= n or start >= n):  # within one part: a view, or read from the file
                return self._base_rows(start, stop) if stop <= n else self._tail[start - n : max(stop, start) - n]
            key = np.arange(start, stop, step)
        rows = np.asarray(key, dtype=np.int64)
        if rows.ndim != 1:
            raise IndexError("rows must be an integer, a slice or a 1-d array of integers")
        rows = np.where(rows < 0, rows + len(self), rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows out of range for a store of {len(self)} rows")
        out = np.empty((len(rows), self.dim), dtype=self.dtype)
        base = rows < n
        out[base] = self._base_take(rows[base])
        out[~base] = self._tail[rows[~base] - n]
        return out

    def _base_rows(self, start: int, stop: int) -> np.ndarray:
        """Loaded rows start..stop (a view of the map, or read from the file: see `_base_take`)."""
        if self._file is None or self._base_written:
            return self._base[start:stop]
        return self._base_take(np.arange(start, stop))

    def _base_take(self, rows: np.ndarray) -> np.ndarray:
        """Loaded rows, read from the file (pread, a call per run of consecutive rows) when it is large, not
        through the memory map: mapped pages of a file this size would stay resident in the process (the kernel
        maps whole folios around each access), as anonymous memory does. Through the map for a small file, or
        once a loaded row was written (the map holds it, the file does not)."""
        if self._file is None or self._base_written:
            return self._base[rows]
        row_bytes = self.dim * self.dtype.itemsize
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        cuts = np.flatnonzero(np.diff(ordered) != 1) + 1
        taken = np.empty((len(rows), self.dim), dtype=self.dtype)
        view = memoryview(taken).cast("B")
        for start, stop in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]])):
            want = (stop - start) * row_bytes
            got = os.preadv(self._file.fileno(), [view[start * row_bytes : stop * row_bytes]],
                            self._offset + int(ordered[start]) * row_bytes)  # fmt: skip
            if got != want:
                raise ConceptNormError(Errors.E004.format(path=self._file.name, detail=f"{got} of {want} bytes read"))
        if len(rows) > 1 and not (np.diff(rows) > 0).all():
            out = np.empty_like(taken)
            out[order] = taken
            return out
        return taken

    def __setitem__(self, rows: int | np.ndarray, values: np.ndarray) -> None:
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        values = self._fitted(np.asarray(values, dtype=np.float32).reshape(len(rows), self.dim))
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows out of range for a store of {len(self)} rows")
        base = rows < len(self._base)
        self._base_written = self._base_written or bool(base.any())
        self._base[rows[base]] = values[base]
        self._tail[rows[~base] - len(self._base)] = values[~base]
        self.version += 1

    def _fitted(self, values: np.ndarray) -> np.ndarray:
        """`values` (float32) as stored; switches the store to float32 when float16 would bend a row too much."""
        if self.dtype == np.float16 and len(values) and not np.all(float16_cosines(values) >= FP16_MIN_COSINE):
            self._base = self._base.astype(np.float32)
            self._tail = self._tail.astype(np.float32)
            self._file = None  # the loaded rows are in memory now
        return values

    def as_float16(self) -> VectorStore:
        """This store if it is float16, else a float16 copy in memory when every row keeps its cosine bound, else
        this store (float32)."""
        if self.dtype == np.float16:
            return self
        copy = VectorStore(self.dim)
        copy.reserve(len(self))
        for _, block in self.blocks():
            copy.append(block)
            if copy.dtype != np.float16:
                return self
        return copy

    def reserve(self, rows: int) -> None:
        """Make room for `rows` rows in all, so that appending up to there copies nothing."""
        spare = rows - len(self._base)
        if spare > len(self._tail):
            grown = np.zeros((spare, self.dim), dtype=self.dtype)
            grown[: self._tail_rows] = self._tail[: self._tail_rows]
            self._tail = grown

    def append(self, values: np.ndarray) -> np.ndarray:
        """Add rows at the end; returns their row numbers."""
        values = self._fitted(np.asarray(values, dtype=np.float32).reshape(-1, self.dim))
        start = len(self)
        needed = self._tail_rows + len(values)
        if needed > len(self._tail):
            self.reserve(len(self._base) + max(needed, 2 * len(self._tail), 16))
        self._tail[self._tail_rows : needed] = values
        self._tail_rows = needed
        self.version += 1
        return np.arange(start, start + len(values), dtype=np.int64)

    def blocks(self, size: int = BLOCK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, float32 rows) for consecutive blocks of at most `size` rows."""
        for start, stop in self._runs(size):
            yield start, np.asarray(self.raw(slice(start, stop)), dtype=np.float32)

    def _runs(self, size: int) -> Iterator[tuple[int, int]]:
        """(start, stop) of consecutive blocks of at most `size` rows, none across the loaded and appended rows."""
        for first, last in ((0, len(self._base)), (len(self._base), len(self))):
            for start in range(first, last, size):
                yield start, min(start + size, last)

    def save(self, path: str | Path) -> int:
        """Write the rows as a `.npy` file (atomically, a block at a time); returns the crc32 of its data."""
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        crc = 0
        with atomic_open(path) as f:
            np.lib.format.write_array_header_1_0(f, header)
            for start, stop in self._runs(BLOCK_ROWS):
                data = np.ascontiguousarray(self.raw(slice(start, stop))).tobytes()
                crc = zlib.crc32(data, crc)
                f.write(data)
        return crc

    @classmethod
    def load(cls, path: str | Path, shape: tuple[int, int] | None = None, crc32: int | None = None) -> VectorStore:
        """Memory-map a `.npy` file written by `save` (or by `np.save`: 2-d float16 or float32). With `shape` and
        `crc32`, the file must match them: its data are read once, a block at a time, to check (not kept)."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                header_shape, _, dtype = read_header(f)
                data_offset = f.tell()
            if np.prod(header_shape) == 0:  # nothing to map
                vectors = np.zeros(header_shape, dtype=dtype)
            else:
                vectors = np.load(path, mmap_mode="c", allow_pickle=False)
        except (OSError, EOFError, ValueError) as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=e)) from None
        if vectors.ndim != 2 or vectors.dtype not in (np.float16, np.float32):
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"not a 2-d float array: {vectors.dtype}"))
        if shape is not None and tuple(vectors.shape) != tuple(shape):
            raise ConceptNormError(Errors.E302.format(path=path, detail=f"its shape is not {tuple(shape)}"))
        if crc32 is not None and file_crc32(path, data_offset) != crc32:
            raise _checksum_error(path)
        store = cls(vectors.shape[1], vectors.dtype)
        store._base = vectors
        if isinstance(vectors, np.memmap) and hasattr(os, "preadv") and vectors.nbytes >= FILE_READ_BYTES:
            store._file, store._offset = open(path, "rb"), vectors.offset  # this file, even once replaced
        return store


def float16_cosines(values: np.ndarray) -> np.ndarray:
    """Each row's cosine to its float16 rounding (1 for a zero row, NaN for one beyond float16's range)."""
    with np.errstate(over="ignore", invalid="ignore"):
        stored = values.astype(np.float16).astype(np.float64)
        norms = np.linalg.norm(values, axis=1) * np.linalg.norm(stored, axis=1)
        dots = (values.astype(np.float64) * stored).sum(axis=1)
        zero = ~np.any(values, axis=1)
        return np.where(zero, 1.0, dots / np.where(norms > 0, norms, np.nan))


def _checksum_error(path: Path) -> ConceptNormError:
    return ConceptNormError(Errors.E302.format(path=path.parent, detail=f"{path.name} does not match its checksum"))


def file_crc32(path: str | Path, offset: int = 0) -> int:
    """crc32 of a file's bytes from `offset` (for a `.npy`: where its data start, after the header), read a block
    at a time so that checking a large file does not hold it in memory."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


class VectorIndex:
    """A FAISS-style inner-product index with stable int64 ids.

    dim (int): Vector dimension.
    index_type (str): "exact", "flat", "hnsw", "ivf", "ivfpq", or "auto" (chosen from the number of vectors first
        added, see `choose_index_type`).
    hnsw_m (int): HNSW graph degree.
    hnsw_ef_search (int): HNSW search breadth (higher: slower, more exact).
    ivf_nlist (int): IVF lists; 0 picks about 4*sqrt(n), at most `IVF_MAX_LISTS`, at training time.
    ivf_nprobe (int): IVF lists visited per query; None: 16 for ivf, 64 for ivfpq (its codes are coarser: on real
        vectors, recall@1 0.968 at 16, 0.983 at 64, see the README, "Large knowledge bases").
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
            raise _checksum_error(path)
        try:
            self._set(faiss.read_index(str(path)))
        except RuntimeError as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=str(e).strip().splitlines()[-1])) from None
        self._removed = set(removed)
        self._gpu_index = None

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
