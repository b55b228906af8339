"""The per-partition vector index: flat then IVF, removal and churn, and partition isolation."""

from __future__ import annotations

import numpy as np

from fleetgate.cache.vectorindex import VectorIndex


def unit(rng: np.random.Generator, n: int, dim: int = 32) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_switches_to_an_ivf_index_past_the_size_and_still_finds_the_nearest() -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 300)
    index = VectorIndex(dim=32, ann_above=100, ann_lists=16, ann_probe=16)
    for i, v in enumerate(vectors):
        index.add(entry_id=f"e{i}", partition="p", vector=v)
    part = index._parts["p"]
    assert part.approximate and part.index.ntotal == 300 and len(index) == 300
    for i in (0, 150, 299):
        found = index.search(partition="p", vector=vectors[i], k=3)
        assert found[0][0] == f"e{i}" and abs(found[0][1] - 1.0) < 1e-4
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)


def test_an_ivf_partition_churns_without_rebuilding_or_growing() -> None:
    """A full cache evicts its oldest entry on every store: the IVF index must absorb that in place (the
    HNSW index it replaced was rebuilt on the event loop every 10% of evictions: 45 s at 100k)."""
    rng = np.random.default_rng(4)
    vectors = unit(rng, 1200)
    index = VectorIndex(dim=32, ann_above=200, ann_lists=8, ann_probe=8)
    for i in range(300):
        index.add(entry_id=f"e{i}", partition="p", vector=vectors[i])
    part = index._parts["p"]
    faiss_index, capacity = part.index, len(part.ids)
    assert len(part.buf) == 0  # the IVF index holds the only copy
    for i in range(300, 1200):  # FIFO: one in, the oldest out, three times over
        index.add(entry_id=f"e{i}", partition="p", vector=vectors[i])
        assert index.remove(f"e{i - 300}")
    assert part.index is faiss_index and part.index.ntotal == 300 and len(index) == 300
    assert len(part.ids) == capacity + 1  # dead positions were reused
    for i in range(0, 1200, 37):
        found = index.search(partition="p", vector=vectors[i], k=2)
        if i < 900:
            assert all(e != f"e{i}" for e, _ in found)
        else:
            assert found[0] == (f"e{i}", found[0][1]) and abs(found[0][1] - 1.0) < 1e-4
            assert np.array_equal(index.vector(f"e{i}"), vectors[i])
    ids, live = index.live_vectors("p")
    assert sorted(ids) == sorted(f"e{i}" for i in range(900, 1200)) and live.shape == (300, 32)


def test_faiss_searches_single_threaded() -> None:
    import faiss

    index = VectorIndex(dim=4)
    index.add(entry_id="a", partition="p", vector=np.array([1, 0, 0, 0], dtype=np.float32))
    assert faiss.omp_get_max_threads() == 1


def test_partitions_never_mix() -> None:
    rng = np.random.default_rng(2)
    v = unit(rng, 2)
    index = VectorIndex(dim=32)
    index.add(entry_id="a", partition="tenant-a", vector=v[0])
    assert index.search(partition="tenant-b", vector=v[0], k=5) == []
    index.add(entry_id="b", partition="tenant-b", vector=v[1])
    assert [e for e, _ in index.search(partition="tenant-b", vector=v[0], k=5)] == ["b"]


def test_removed_entries_are_never_returned_and_compaction_keeps_the_rest() -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng, 50)
    index = VectorIndex(dim=32, ann_above=10, ann_lists=4, ann_probe=4)
    for i, v in enumerate(vectors):
        index.add(entry_id=f"e{i}", partition="p", vector=v)
    for i in range(0, 50, 2):
        assert index.remove(f"e{i}")
    assert not index.remove("e0") and len(index) == 25
    for i in range(50):
        found = index.search(partition="p", vector=vectors[i], k=1)
        expected = f"e{i}" if i % 2 else None
        if expected:
            assert found[0][0] == expected
        else:
            assert all(e != f"e{i}" for e, _ in found)
    for i in range(1, 50, 2):
        index.remove(f"e{i}")
    assert len(index) == 0 and index.search(partition="p", vector=vectors[1], k=1) == []

