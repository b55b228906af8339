"""The remote encoder (`semantic.embedder: remote`): requests, answers checked, bounded waits, the breaker.

The encoder service is `fleetgate.bench.encoder_stub` on a loopback port inside the test's loop, answering
each text with a deterministic unit vector of its token ids (not MiniLM's: the identity check is off here,
and on in the component tests, which serve real MiniLM vectors)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Sequence

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.bench.encoder_stub import STATE, encoder_app, serving
from fleetgate.cache.config import RemoteEncoderConfig
from fleetgate.cache.metrics import EncoderMetrics
from fleetgate.cache.remote_encoder import Breaker, EncoderUnavailable, RemoteEncoder, parse_vectors
from fleetgate.core.embed_batcher import BatchingEmbedder
from fleetgate.core.localredis import free_port


def fake_vectors(batch: Sequence[Sequence[int]]) -> np.ndarray:
    """A unit vector per id sequence, the same for the same ids."""
    out = np.stack([np.random.default_rng(abs(hash(tuple(ids))) % 2**32).standard_normal(384) for ids in batch])
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def encoder(url: str | None, **settings: object) -> RemoteEncoder:
    config = RemoteEncoderConfig(url=url, check_identity=False, **settings)  # type: ignore[arg-type]
    return RemoteEncoder(config=config, metrics=EncoderMetrics(CollectorRegistry()))


def body(rows: list[object]) -> bytes:
    return orjson.dumps({"data": [{"index": i, "embedding": r} for i, r in enumerate(rows)]})


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


# -- answers ---------------------------------------------------------------------------------------------------
def test_answers_in_base64_or_floats_come_back_in_input_order() -> None:
    a, b = unit(1), unit(2)
    raw = orjson.dumps({"data": [{"index": 1, "embedding": b.tolist()},
                                 {"index": 0, "embedding": base64.b64encode(a.tobytes()).decode()}]})
    out = parse_vectors(raw, count=2)
    assert out.dtype == np.float32 and np.array_equal(out[0], a) and np.allclose(out[1], b)


@pytest.mark.parametrize("raw", [
    b"<html>502 Bad Gateway</html>",
    b'{"object": "list"}',
    body([unit(1).tolist()]),  # one row for two texts
    body([unit(1).tolist(), unit(2)[:100].tolist()]),  # a short row
    body([unit(1).tolist(), (3 * unit(2)).tolist()]),  # not unit length
    body([unit(1).tolist(), [float("nan")] * 384]),
    body([unit(1).tolist(), "not base64!"]),
    body([unit(1).tolist(), [True] * 384]),
    body([unit(1).tolist(), {"vector": 1}]),
])
def test_anything_but_two_unit_rows_of_384_is_garbage(raw: bytes) -> None:
    with pytest.raises(EncoderUnavailable) as caught:
        parse_vectors(raw, count=2)
    assert caught.value.reason == "garbage"


# -- the breaker -----------------------------------------------------------------------------------------------
def test_the_breaker_opens_after_failures_in_a_row_and_admits_one_probe_after_the_wait() -> None:
    now = [0.0]
    breaker = Breaker(failures=3, retry_after_s=2.0, clock=lambda: now[0])
    for _ in range(2):
        assert breaker.admit()
        breaker.failed()
    breaker.succeeded()  # a success in between: the count starts over
    for _ in range(3):
        assert breaker.admit()
        breaker.failed()
    assert not breaker.closed and not breaker.admit()
    now[0] = 2.5
    assert breaker.admit() and not breaker.admit()  # one probe, the rest keep going without it
    breaker.failed()  # the probe failed: open again for the whole wait
    now[0] = 4.0
    assert not breaker.admit()
    now[0] = 4.6
    assert breaker.admit()
    breaker.succeeded()
    assert breaker.closed and breaker.admit() and breaker.admit()


# -- requests --------------------------------------------------------------------------------------------------
async def test_token_ids_go_out_and_each_text_gets_its_own_row() -> None:
    app = encoder_app(vectors=fake_vectors)
    async with serving(app) as url:
        remote = encoder(url)
        texts = ["How do I reverse a list in Python?", "hello", "How do I reverse a list in Python?"]
        vectors = await remote.aencode(texts)
        ids = remote.token_ids(texts)
        assert ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] ... [SEP], as the in-process encoder runs them
        assert np.array_equal(vectors, fake_vectors(ids))
        assert app[STATE] == {"requests": 1, "texts": 3}
        # the blocking twin asks the same (in a thread: this loop serves the stub)
        assert np.array_equal(await asyncio.to_thread(remote.embed, texts), vectors)
        await remote.aclose()


async def test_a_long_prompt_is_sent_truncated_at_256_tokens_like_the_in_process_encoder() -> None:
    seen: list[list[int]] = []

    def record(batch: Sequence[Sequence[int]]) -> np.ndarray:
        seen.extend(list(ids) for ids in batch)
        return fake_vectors(batch)

    async with serving(encoder_app(vectors=record)) as url:
        remote = encoder(url)
        await remote.aencode(["word " * 600])
        await remote.aclose()
    assert len(seen[0]) == 256 and seen[0][-1] == 102


async def test_a_stalled_service_costs_a_lookup_its_timeout_then_nothing_while_the_circuit_is_open() -> None:
    async with serving(encoder_app(vectors=None, mode="stall")) as url:
        remote = encoder(url, timeout_ms=150, failures_to_open=2, retry_after_s=30)
        for _ in range(2):
            t0 = time.perf_counter()
            with pytest.raises(EncoderUnavailable) as caught:
                await remote.aencode(["are you there?"])
            assert caught.value.reason == "timeout" and time.perf_counter() - t0 < 0.5
        t0 = time.perf_counter()
        with pytest.raises(EncoderUnavailable) as caught:
            await remote.aencode(["are you there?"])
        assert caught.value.reason == "circuit_open" and time.perf_counter() - t0 < 0.01
        await remote.aclose()


async def test_a_dead_service_fails_fast_and_the_probe_after_the_wait_finds_it_back() -> None:
    port = free_port()
    remote = encoder(f"http://127.0.0.1:{port}", failures_to_open=1, retry_after_s=0.2)
    with pytest.raises(EncoderUnavailable) as caught:
        await remote.aencode(["anyone?"])
    assert caught.value.reason == "error"
    with pytest.raises(EncoderUnavailable) as caught:
        await remote.aencode(["anyone?"])
    assert caught.value.reason == "circuit_open"
    async with serving(encoder_app(vectors=fake_vectors), port=port):
        await asyncio.sleep(0.25)
        assert (await remote.aencode(["anyone?"])).shape == (1, 384)
        assert remote.breaker.closed
    await remote.aclose()


@pytest.mark.parametrize("mode, reason", [("garbage", "garbage"), ("error", "error")])
async def test_a_service_answering_garbage_or_errors_is_a_failure_never_a_vector(mode: str, reason: str) -> None:
    async with serving(encoder_app(vectors=None, mode=mode)) as url:
        remote = encoder(url)
        with pytest.raises(EncoderUnavailable) as caught:
            await remote.aencode(["one", "two"])
        assert caught.value.reason == reason
        await remote.aclose()


async def test_without_a_url_the_discovered_endpoints_are_used_in_turn() -> None:
    apps = [encoder_app(vectors=fake_vectors), encoder_app(vectors=fake_vectors)]
    async with serving(apps[0]) as first, serving(apps[1]) as second:
        urls: list[str] = []
        remote = RemoteEncoder(config=RemoteEncoderConfig(check_identity=False), endpoints=lambda: urls)
        with pytest.raises(EncoderUnavailable) as caught:
            await remote.aencode(["nothing discovered yet"])
        assert caught.value.reason == "no_endpoint" and remote.breaker.closed  # not the service's fault
        urls += [first, second]
        for i in range(4):
            await remote.aencode([f"text {i}"])
        assert [a[STATE]["requests"] for a in apps] == [2, 2]
        await remote.aclose()


async def test_the_batcher_sends_concurrent_lookups_in_few_requests_and_bounds_each_wait() -> None:
    app = encoder_app(vectors=fake_vectors, delay_ms=30)
    async with serving(app) as url:
        remote = encoder(url, max_in_flight=2, timeout_ms=2000)
        batcher = BatchingEmbedder(embedder=remote, max_batch=64, max_in_flight=2, timeout_s=remote.timeout_s)
        texts = [f"question {i}" for i in range(40)]
        vectors = await asyncio.gather(*(batcher.aembed(t) for t in texts))
        want = fake_vectors(remote.token_ids(texts))
        assert all(np.array_equal(v, w) for v, w in zip(vectors, want, strict=True))
        # the first text goes alone; the 39 that arrived during its request share the next one or two
        assert app[STATE]["requests"] <= 3 and app[STATE]["texts"] == 40
        await batcher.aclose()
    async with serving(encoder_app(vectors=None, mode="stall")) as url:
        remote = encoder(url, timeout_ms=100)
        batcher = BatchingEmbedder(embedder=remote, max_batch=8, max_in_flight=1, timeout_s=remote.timeout_s)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(batcher.aembed(f"q {i}") for i in range(20)), return_exceptions=True)
        # 20 callers, 8 a batch, one request at a time: none waits past its bound, queueing included
        assert time.perf_counter() - t0 < 0.4
        assert all(isinstance(r, TimeoutError | EncoderUnavailable) for r in results)
        await batcher.aclose()


async def test_metrics_count_requests_batch_sizes_and_the_circuit() -> None:
    registry = CollectorRegistry()
    metrics = EncoderMetrics(registry)
    async with serving(encoder_app(vectors=fake_vectors)) as url:
        remote = RemoteEncoder(config=RemoteEncoderConfig(url=url, check_identity=False), metrics=metrics)
        await remote.aencode(["a", "b", "c"])
        await remote.aclose()
    remote = RemoteEncoder(config=RemoteEncoderConfig(url=f"http://127.0.0.1:{free_port()}", check_identity=False,
                                                      failures_to_open=1), metrics=metrics)
    with pytest.raises(EncoderUnavailable):
        await remote.aencode(["d"])
    value = registry.get_sample_value
    assert value("fleetgate_cache_encoder_requests_total", {"result": "ok"}) == 1
    assert value("fleetgate_cache_encoder_requests_total", {"result": "error"}) == 1
    assert value("fleetgate_cache_encoder_batch_texts_sum") == 3
    assert value("fleetgate_cache_encoder_up") == 0
    await remote.aclose()


async def test_an_outage_is_logged_when_the_circuit_opens_and_when_the_service_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    remote = encoder(f"http://127.0.0.1:{port}", failures_to_open=2, retry_after_s=0.1)
    with caplog.at_level("WARNING", logger="fleetgate.cache"):
        for _ in range(4):
            with pytest.raises(EncoderUnavailable):
                await remote.aencode(["x"])
        assert [r.message for r in caplog.records if "failed 2 times in a row" in r.message]  # once, not per lookup
        assert len(caplog.records) == 1
        async with serving(encoder_app(vectors=fake_vectors), port=port):
            await asyncio.sleep(0.15)
            await remote.aencode(["x"])
        assert "answers again" in caplog.records[-1].message
    await remote.aclose()
