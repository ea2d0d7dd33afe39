"""The name vectors, held once for the searcher and all its indexes (`index.VectorIndex.on_store`).

Rows are read as float32 and stored as float16 while every row keeps a cosine of at least `FP16_MIN_COSINE` to its
float32 value, else as float32 from then on: half the memory wherever float16 keeps the vectors' directions. A
saved store is a plain `.npy` file whose data carry a crc32, checked (with the shape) on loading; it is loaded
memory-mapped copy-on-write, so a large KB's vectors are read from disk as searches need them.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open

BLOCK_ROWS = 16384  # rows converted to float32 (or searched) at a time
FILE_READ_BYTES = 256 * 2**20  # loaded vectors this large are read from their file, not through the memory map
FP16_MIN_COSINE = 0.999  # float16 storage while every row keeps this cosine to its float32 value


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
            # the same values (float16 -> float32 is exact) by torch's vectorized kernel, about 6x faster than numpy's
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
            raise checksum_error(path)
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


def checksum_error(path: Path) -> ConceptNormError:
    """E989 for a saved file whose bytes do not match the crc32 recorded for it."""
    return ConceptNormError(Errors.E989.format(path=path))


def file_crc32(path: str | Path, offset: int = 0) -> int:
    """crc32 of a file's bytes from `offset` (for a `.npy`: where its data start, after the header), read a block
    at a time so that checking a large file does not hold it in memory."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc
