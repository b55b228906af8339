"""A process-local vector index, one faiss index per cache partition.

Inputs: L2-normalised float32 vectors, so inner product == cosine similarity.

- A partition starts as an exact `IndexFlatIP` (a scan; exact and fastest below ~20k vectors) and is
  rebuilt as `IndexHNSWFlat` (inner-product metric, `hnsw_m` links per node, `efSearch` = `hnsw_ef_search`)
  once it holds more than `hnsw_above` vectors, keeping search well under a millisecond at 100k.
- faiss's HNSW cannot delete, so removal marks a position dead; searches over-fetch (`k * 4`) and drop
  dead positions, and a partition is compacted (rebuilt from its live vectors) when over 10% is dead.

Not thread-safe: the cache mutates and searches it on the event loop only (embedding runs in threads).

A search runs on one OpenMP thread (`search_one`): a lookup asks for one query, and faiss's flat scan opens
a team of `omp_get_max_threads()` threads for it, which on a busy box wait for each other's cores.
Measured on the shared 2-core box under load, 20k vectors x 384: p50 23 ms with the default two threads,
2.9 ms with one (identical results; HNSW searches of one query open no team and are unchanged).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def search_one(index: Any, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`index.search(query, k)` for one query row, on one OpenMP thread (this thread's setting, restored)."""
    import faiss

    threads = faiss.omp_get_max_threads()
    if threads == 1:
        return index.search(query, k)
    faiss.omp_set_num_threads(1)
    try:
        return index.search(query, k)
    finally:
        faiss.omp_set_num_threads(threads)


class _Partition:
    def __init__(self, *, dim: int) -> None:
        self.dim = dim
        self.buf = np.zeros((16, dim), dtype=np.float32)  # grows by doubling: adds are amortised O(1)
        self.ids: list[str] = []
        self.dead: set[int] = set()
        self.index: Any = None
        self.hnsw = False

    @property
    def vectors(self) -> np.ndarray:
        return self.buf[: len(self.ids)]

    def append(self, entry_id: str, row: np.ndarray) -> None:
        n = len(self.ids)
        if n == len(self.buf):
            grown = np.zeros((2 * n, self.dim), dtype=np.float32)
            grown[:n] = self.buf
            self.buf = grown
        self.buf[n] = row
        self.ids.append(entry_id)

    @property
    def live(self) -> int:
        return len(self.ids) - len(self.dead)


class VectorIndex:
    def __init__(self, *, dim: int, hnsw_above: int = 20_000, hnsw_m: int = 32, hnsw_ef_search: int = 64) -> None:
        self.dim = dim
        self.hnsw_above = hnsw_above
        self.hnsw_m = hnsw_m
        self.hnsw_ef_search = hnsw_ef_search
        self._parts: dict[str, _Partition] = {}
        self._where: dict[str, tuple[str, int]] = {}  # entry id -> (partition, position)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._where

    def clear(self) -> None:
        self._parts.clear()
        self._where.clear()

    def _new_index(self, part: _Partition) -> Any:
        import faiss

        if part.hnsw:
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 40
            index.hnsw.efSearch = self.hnsw_ef_search
            return index
        return faiss.IndexFlatIP(self.dim)

    def _rebuild(self, part: _Partition, partition: str) -> None:
        keep = [i for i in range(len(part.ids)) if i not in part.dead]
        live = np.ascontiguousarray(part.vectors[keep])
        part.buf = np.zeros((max(16, 2 * len(keep)), self.dim), dtype=np.float32)
        part.buf[: len(keep)] = live
        part.ids = [part.ids[i] for i in keep]
        part.dead = set()
        part.hnsw = part.hnsw or len(part.ids) > self.hnsw_above
        part.index = self._new_index(part)
        if part.ids:
            part.index.add(np.ascontiguousarray(part.vectors))
        for pos, entry_id in enumerate(part.ids):
            self._where[entry_id] = (partition, pos)

    def add(self, *, entry_id: str, partition: str, vector: np.ndarray) -> None:
        if entry_id in self._where:
            return
        row = np.asarray(vector, dtype=np.float32).reshape(1, self.dim)
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition(dim=self.dim)
            part.index = self._new_index(part)
        part.append(entry_id, row[0])
        self._where[entry_id] = (partition, len(part.ids) - 1)
        if not part.hnsw and len(part.ids) > self.hnsw_above:
            self._rebuild(part, partition)
        else:
            part.index.add(row)

    def remove(self, entry_id: str) -> bool:
        where = self._where.pop(entry_id, None)
        if where is None:
            return False
        partition, pos = where
        part = self._parts[partition]
        part.dead.add(pos)
        if part.live == 0:
            del self._parts[partition]
        elif len(part.dead) * 10 > len(part.ids):
            self._rebuild(part, partition)
        return True

    def vector(self, entry_id: str) -> np.ndarray | None:
        """The stored vector of a live entry (None when it has none here)."""
        where = self._where.get(entry_id)
        if where is None:
            return None
        partition, pos = where
        return self._parts[partition].vectors[pos]

    def search(self, *, partition: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Up to `k` live entries of `partition`, most similar first, as (entry id, cosine)."""
        part = self._parts.get(partition)
        if part is None or part.live == 0:
            return []
        fetch = min(len(part.ids), k * 4 if part.dead else k)
        scores, positions = search_one(part.index, np.asarray(vector, dtype=np.float32).reshape(1, self.dim), fetch)
        out: list[tuple[str, float]] = []
        for score, pos in zip(scores[0], positions[0], strict=True):
            if pos < 0 or int(pos) in part.dead:
                continue
            out.append((part.ids[int(pos)], float(score)))
            if len(out) == k:
                break
        return out
