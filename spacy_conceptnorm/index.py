"""Vector index: inner product on unit vectors (= cosine), with int64 ids that can be added and removed at any
time.

- `exact` (default): exact search as one matrix product per batch of queries in torch (on the GPU when torch sees
  one). On the 2-core CPUs we run on it is ~5x faster than FAISS's flat index, whose bundled BLAS is slow here.
  Rebuilt from the vectors when loaded, so only the vectors are saved.
- `flat`: FAISS `IndexFlatIP`, exact; searched on the GPU when faiss-gpu (the `gpu` extra) sees one.
- `hnsw`: FAISS graph search for KBs of millions of names; fast, approximate, no true removal (removed ids are
  filtered out of results until the next rebuild).
- `ivf`: FAISS inverted lists; trained on the first vectors added, searched with `nprobe` lists.
"""

from __future__ import annotations

import faiss
import numpy as np
import torch

from .errors import ConceptNormError, Errors
from .threads import install_thread_settings

INDEX_TYPES = ("exact", "flat", "hnsw", "ivf")
QUERY_CHUNK = 512  # queries per matrix product in exact search: bounds the score matrix to 512 x names


def _gpu_count() -> int:
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


class VectorIndex:
    """A FAISS inner-product index with stable int64 ids.

    dim (int): Vector dimension.
    index_type (str): "exact", "flat", "hnsw" or "ivf".
    hnsw_m (int): HNSW graph degree.
    hnsw_ef_search (int): HNSW search breadth (higher: slower, more exact).
    ivf_nlist (int): IVF lists; 0 picks about 4*sqrt(n) at training time.
    ivf_nprobe (int): IVF lists visited per query.
    """

    def __init__(
        self,
        dim: int,
        index_type: str = "exact",
        hnsw_m: int = 32,
        hnsw_ef_search: int = 128,
        ivf_nlist: int = 0,
        ivf_nprobe: int = 16,
    ) -> None:
        if index_type not in INDEX_TYPES:
            raise ConceptNormError(Errors.E103.format(index_type=index_type, choices=INDEX_TYPES))
        self.dim = dim
        self.index_type = index_type
        self.hnsw_m, self.hnsw_ef_search = hnsw_m, hnsw_ef_search
        self.ivf_nlist, self.ivf_nprobe = ivf_nlist, ivf_nprobe
        self._removed: set[int] = set()  # hnsw only
        self._index = self._new_index()
        self._gpu_index = None
        install_thread_settings()  # FAISS and torch (the exact index) hang in forked workers otherwise

    def _new_index(self):
        if self.index_type == "exact":
            return _ExactIndex(self.dim)
        if self.index_type == "flat":
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        if self.index_type == "hnsw":
            hnsw = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efSearch = self.hnsw_ef_search
            return faiss.IndexIDMap2(hnsw)
        return None  # ivf: created when the first vectors arrive, since it is trained on them

    def __len__(self) -> int:
        return 0 if self._index is None else self._index.ntotal - len(self._removed)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ConceptNormError(Errors.E104.format(expected=self.dim, found=vectors.shape[-1]))
        if not len(vectors):
            return
        ids = np.asarray(ids, dtype=np.int64)
        if self._index is None:
            nlist = self.ivf_nlist or max(1, min(len(vectors) // 39, int(4 * np.sqrt(len(vectors)))))
            self._index = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
            self._index.train(vectors)
            self._index.nprobe = self.ivf_nprobe
        self._removed.difference_update(ids.tolist())
        self._index.add_with_ids(vectors, ids)
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
        fetch = min(k + len(self._removed), self._index.ntotal)
        scores, ids = self._searcher().search(queries, fetch)
        if self._removed:
            keep = ~np.isin(ids, list(self._removed))
            scores = np.where(keep, scores, -np.inf)
            order = np.argsort(-scores, axis=1, kind="stable")
            scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(np.where(keep, ids, -1), order, 1)
        if fetch < k:
            pad = k - fetch
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        return scores[:, :k], ids[:, :k]

    def _searcher(self):
        if self.index_type != "flat" or _gpu_count() == 0:
            return self._index
        if self._gpu_index is None:
            self._gpu_resources = faiss.StandardGpuResources()
            self._gpu_index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self._index)
        return self._gpu_index

    def to_bytes(self) -> bytes:
        """The serialized FAISS index (empty for exact and flat indexes, which are rebuilt from their vectors)."""
        if self.index_type in ("exact", "flat") or self._index is None:
            return b""
        return faiss.serialize_index(self._index).tobytes()

    def load_bytes(self, data: bytes, removed: list[int]) -> None:
        if data:
            self._index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
            if self.index_type == "ivf":
                self._index.nprobe = self.ivf_nprobe
        self._removed = set(removed)
        self._gpu_index = None

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
        }


class _ExactIndex:
    """Exact inner-product search with torch, in the FAISS calling convention (`ntotal`, `add_with_ids`,
    `remove_ids`, `search`)."""

    def __init__(self, dim: int) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.ids = np.zeros(0, dtype=np.int64)
        self.matrix = torch.zeros((0, dim), dtype=torch.float32, device=self.device)

    @property
    def ntotal(self) -> int:
        return len(self.ids)

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
