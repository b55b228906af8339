"""The per-partition vector index: flat then HNSW, removal, and partition isolation."""

from __future__ import annotations

import numpy as np

from fleetgate.cache.vectorindex import VectorIndex


def unit(rng: np.random.Generator, n: int, dim: int = 32) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_switches_to_hnsw_past_the_size_and_still_finds_the_nearest() -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 300)
    index = VectorIndex(dim=32, hnsw_above=100, hnsw_m=16, hnsw_ef_search=64)
    for i, v in enumerate(vectors):
        index.add(entry_id=f"e{i}", partition="p", vector=v)
    part = index._parts["p"]
    assert part.hnsw and len(index) == 300
    for i in (0, 150, 299):
        found = index.search(partition="p", vector=vectors[i], k=3)
        assert found[0][0] == f"e{i}" and abs(found[0][1] - 1.0) < 1e-4
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)


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
    index = VectorIndex(dim=32, hnsw_above=10)
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


def test_one_query_searches_on_one_openmp_thread_with_the_same_result_and_the_setting_restored() -> None:
    import faiss

    from fleetgate.cache.vectorindex import search_one

    rng = np.random.default_rng(5)
    vectors = unit(rng, 500)
    flat = faiss.IndexFlatIP(32)
    flat.add(vectors)
    before = faiss.omp_get_max_threads()
    scores, ids = search_one(flat, vectors[:1], 5)
    assert faiss.omp_get_max_threads() == before
    want_scores, want_ids = flat.search(vectors[:1], 5)
    assert (ids == want_ids).all() and np.allclose(scores, want_scores) and ids[0][0] == 0
