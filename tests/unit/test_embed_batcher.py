"""The micro-batcher: concurrent callers share one encode, waits are bounded, errors and cancellations."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.core.embed_batcher import BatchingEmbedder


class RecordingEmbedder(HashingEmbedder):
    """Hashing vectors; records each call's texts and can hold a call until released or fail it."""

    def __init__(self, *, hold: threading.Event | None = None, fail: Exception | None = None) -> None:
        super().__init__(dim=32)
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.hold = hold
        self.fail = fail

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if self.hold is not None:
            self.hold.wait(5)
        if self.fail is not None:
            raise self.fail
        return super().embed(texts)


async def held(first: str) -> tuple[threading.Event, RecordingEmbedder, BatchingEmbedder, asyncio.Future[np.ndarray]]:
    """A batcher whose worker is busy encoding `first` until the returned event is set."""
    hold = threading.Event()
    inner = RecordingEmbedder(hold=hold)
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, max_wait_s=0.0)
    running = asyncio.ensure_future(batcher.aembed(first))
    await started(inner)
    return hold, inner, batcher, running


async def started(inner: RecordingEmbedder) -> None:
    """Until the worker thread has entered the (held) encode."""
    for _ in range(500):
        if inner.calls:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the encode never started")


async def test_concurrent_callers_share_one_encode_and_get_their_own_rows() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=64, max_wait_s=0.05)
    texts = [f"question number {i}" for i in range(20)]
    vectors = await asyncio.gather(*(batcher.aembed(t) for t in texts))
    assert inner.calls == [texts]  # one encode, in arrival order
    for text, vector in zip(texts, vectors, strict=True):
        assert np.array_equal(vector, HashingEmbedder(dim=32).embed([text])[0])
    assert threading.main_thread().name not in inner.threads  # off the event loop's thread
    await batcher.aclose()


async def test_a_full_batch_goes_at_once_and_the_rest_forms_the_next() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=8, max_wait_s=5.0)
    start = time.perf_counter()
    await asyncio.gather(*(batcher.aembed(f"t{i}") for i in range(16)))
    assert time.perf_counter() - start < 2.0  # full batches never wait out max_wait_s
    assert [len(c) for c in inner.calls] == [8, 8]
    await batcher.aclose()


async def test_a_lone_request_waits_at_most_max_wait() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, max_wait_s=0.2)
    await batcher.aembed("warm the worker thread")
    start = time.perf_counter()
    await batcher.aembed("alone")
    elapsed = time.perf_counter() - start
    assert 0.15 <= elapsed < 1.5
    assert inner.calls[-1] == ["alone"]
    await batcher.aclose()


async def test_texts_arriving_during_an_encode_form_the_next_batch() -> None:
    hold, inner, batcher, first = await held("first")
    later = [asyncio.ensure_future(batcher.aembed(f"later {i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    hold.set()
    await asyncio.gather(first, *later)
    assert inner.calls == [["first"], [f"later {i}" for i in range(5)]]
    await batcher.aclose()


async def test_an_encode_error_reaches_every_caller_of_the_batch_and_the_next_batch_runs() -> None:
    inner = RecordingEmbedder(fail=RuntimeError("model exploded"))
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, max_wait_s=0.05)
    results = await asyncio.gather(*(batcher.aembed(f"t{i}") for i in range(4)), return_exceptions=True)
    assert len(inner.calls) == 1
    assert all(isinstance(r, RuntimeError) and str(r) == "model exploded" for r in results)
    inner.fail = None
    vector = await batcher.aembed("after the failure")
    assert vector.shape == (32,)
    await batcher.aclose()


async def test_cancelling_one_waiter_does_not_break_the_others() -> None:
    hold = threading.Event()
    inner = RecordingEmbedder(hold=hold)
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, max_wait_s=0.0)
    blocker = asyncio.ensure_future(batcher.aembed("blocker"))
    await started(inner)
    queued = [asyncio.ensure_future(batcher.aembed(f"q{i}")) for i in range(3)]
    in_flight_cancel = blocker  # cancelled while its encode runs
    await asyncio.sleep(0.02)
    queued[1].cancel()  # cancelled while queued: it costs no encode
    in_flight_cancel.cancel()
    hold.set()
    done = await asyncio.gather(queued[0], queued[2])
    assert all(v.shape == (32,) for v in done)
    assert inner.calls[1] == ["q0", "q2"]
    with pytest.raises(asyncio.CancelledError):
        await queued[1]
    assert (await batcher.aembed("still working")).shape == (32,)
    await batcher.aclose()


def test_load_is_lazy_unless_preload_is_set() -> None:
    class Loadable(RecordingEmbedder):
        loads = 0

        def load(self) -> None:
            self.loads += 1

    lazy, eager = Loadable(), Loadable()
    BatchingEmbedder(embedder=lazy).load()
    BatchingEmbedder(embedder=eager, preload=True).load()
    assert (lazy.loads, eager.loads) == (0, 1)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        BatchingEmbedder(embedder=HashingEmbedder(), max_batch=0)


def test_length_groups_cover_every_text_once_with_bounded_padding() -> None:
    from fleetgate.core.minilm_onnx import length_groups

    lengths = [5, 5, 6, 20, 21, 100, 7, 5, 256, 12, 13, 12] + [9] * 40
    groups = length_groups(lengths, max_padding=0.2, max_group=32)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) <= 32
        assert len(g) == 1 or sum(lengths[i] for i in g) >= 0.8 * longest * len(g) - 1e-9
    assert [len(g) for g in length_groups([10] * 40)] == [32, 8]
    assert length_groups([]) == []


async def test_the_memo_answers_a_repeated_text_without_an_encode_and_hands_out_copies() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, memo_entries=8)
    first = await batcher.aembed("What is the capital of France?")
    first[:] = 0.0  # a caller scribbling on its vector must not poison the memo
    again = await batcher.aembed("What is the capital of France?")
    assert inner.calls == [["What is the capital of France?"]]
    assert batcher.memo_hits == 1
    assert np.array_equal(again, HashingEmbedder(dim=32).embed(["What is the capital of France?"])[0])
    # exact text only: any other string is encoded
    await batcher.aembed("What is the capital of France? ")
    assert len(inner.calls) == 2
    await batcher.aclose()


async def test_the_memo_is_bounded_least_recently_used_out_first() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, memo_entries=2)
    for text in ("a", "b", "a", "c"):  # "a" used again before "c" arrives: "b" is the one dropped
        await batcher.aembed(text)
    assert inner.calls == [["a"], ["b"], ["c"]]
    await batcher.aembed("a")
    assert len(inner.calls) == 3
    await batcher.aembed("b")
    assert inner.calls[-1] == ["b"]
    assert len(batcher._memo) == 2
    await batcher.aclose()


async def test_without_a_memo_or_after_a_failed_encode_every_call_encodes() -> None:
    inner = RecordingEmbedder(fail=RuntimeError("model exploded"))
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, memo_entries=8)
    with pytest.raises(RuntimeError):
        await batcher.aembed("x")
    inner.fail = None
    await batcher.aembed("x")  # the failure stored nothing
    assert len(inner.calls) == 2
    off = BatchingEmbedder(embedder=inner, max_batch=32)
    await off.aembed("x")
    await off.aembed("x")
    assert len(inner.calls) == 4 and off.memo_hits == 0
    with pytest.raises(ValueError, match="memo_entries"):
        BatchingEmbedder(embedder=inner, memo_entries=-1)
    await batcher.aclose()
    await off.aclose()


async def test_memo_entries_are_per_scope_so_one_tenant_cannot_time_anothers_texts() -> None:
    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, memo_entries=8)
    a = await batcher.aembed("the same prompt", scope="partition-a")
    b = await batcher.aembed("the same prompt", scope="partition-b")  # another tenant: encoded, not remembered
    assert len(inner.calls) == 2 and batcher.memo_hits == 0
    assert np.array_equal(a, b)  # the scope never changes the vector
    await batcher.aembed("the same prompt", scope="partition-a")
    assert len(inner.calls) == 2 and batcher.memo_hits == 1
    await batcher.aclose()


async def test_the_cache_keys_the_memo_by_partition() -> None:
    from prometheus_client import CollectorRegistry

    from fleetgate.cache.config import CacheConfig, SemanticConfig
    from fleetgate.cache.metrics import CacheMetrics
    from fleetgate.cache.twolayer import TwoLayerCache
    from fleetgate.cache.types import CacheRequest
    from fleetgate.core.kvstore import MemoryKVStore

    def req(tenant: str) -> CacheRequest:
        return CacheRequest(
            tenant=tenant,
            model="m",
            kind="chat",
            body={"messages": [{"role": "user", "content": "How do I sort a slice in Go?"}], "temperature": 0},
        )

    inner = RecordingEmbedder()
    batcher = BatchingEmbedder(embedder=inner, max_batch=32, memo_entries=8)
    cache = TwoLayerCache(
        config=CacheConfig(semantic=SemanticConfig(embedder="hashing")),
        kvstore=MemoryKVStore(),
        embedder=batcher,
        metrics=CacheMetrics(CollectorRegistry()),
    )
    await cache.start()
    await cache.warm_up()
    for tenant in ("alice", "bob", "alice"):
        await cache.lookup(req(tenant))
    assert len(inner.calls) == 2 and batcher.memo_hits == 1  # alice's retry is free; bob's first ask is not
    await cache.aclose()
    await batcher.aclose()


async def test_concurrent_callers_of_one_text_share_one_encode_and_get_their_own_copies() -> None:
    hold, inner, batcher, running = await held("the nearest entry's text")  # being encoded: later callers join it
    joined = [asyncio.ensure_future(batcher.aembed("the nearest entry's text")) for _ in range(5)]
    queued = [asyncio.ensure_future(batcher.aembed("queued text")) for _ in range(3)]  # queued: they join too
    other_scope = asyncio.ensure_future(batcher.aembed("queued text", scope="another tenant"))
    await asyncio.sleep(0.02)
    hold.set()
    first, *rest = await asyncio.gather(running, *joined)
    queued_vectors = await asyncio.gather(*queued)
    await other_scope
    assert inner.calls == [["the nearest entry's text"], ["queued text", "queued text"]]  # one per scope
    assert batcher.coalesced == 5 + 2
    assert all(np.array_equal(v, first) and v is not first for v in rest)
    rest[0][:] = 0.0  # a caller changing its vector changes nobody else's
    assert first.any() and queued_vectors[0] is not queued_vectors[1]
    await batcher.aclose()


async def test_a_shared_encode_survives_its_first_caller_leaving_and_is_dropped_when_all_leave() -> None:
    hold, inner, batcher, blocker = await held("blocker")
    first = asyncio.ensure_future(batcher.aembed("shared"))
    second = asyncio.ensure_future(batcher.aembed("shared"))
    gone = [asyncio.ensure_future(batcher.aembed("abandoned")) for _ in range(2)]
    await asyncio.sleep(0.02)
    first.cancel()  # the caller that queued it leaves; the other still gets its vector
    for task in gone:
        task.cancel()  # every caller of "abandoned" leaves: no encode is spent on it
    hold.set()
    assert (await second).shape == (32,) and (await blocker).shape == (32,)
    assert inner.calls == [["blocker"], ["shared"]]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not batcher._inflight
    await batcher.aclose()


async def test_callers_sharing_an_encode_that_fails_all_get_the_error_and_the_next_call_retries() -> None:
    hold, inner, batcher, blocker = await held("blocker")
    inner.fail = RuntimeError("model exploded")
    joined = [asyncio.ensure_future(batcher.aembed("same text")) for _ in range(3)]
    await asyncio.sleep(0.02)
    hold.set()
    results = await asyncio.gather(blocker, *joined, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and batcher.coalesced == 2
    assert not batcher._inflight  # nothing left that a later caller could join
    inner.fail = None
    assert (await batcher.aembed("same text")).shape == (32,)
    assert inner.calls[-1] == ["same text"]
    await batcher.aclose()
