"""`fleetgate bench encoder-service` and the gateway benchmark's `remote` embedder, against the loopback stub."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetgate.bench.encoder_service import Texts, run_phase
from fleetgate.bench.encoder_stub import STATE, encoder_app, serving
from fleetgate.bench.gateway_stack import gateway_settings
from fleetgate.cache.config import CacheConfig


def unit_rows(batch: Sequence[Sequence[int]]) -> np.ndarray:
    out = np.ones((len(batch), 384), dtype=np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


async def test_a_phase_counts_texts_and_requests_and_refuses_answers_the_cache_would_refuse() -> None:
    texts = Texts()
    app = encoder_app(vectors=unit_rows)
    async with serving(app) as url:
        phase = await run_phase(url, "all-minilm-l6-v2", texts, name="4 x 8", clients=4, batch=8, duration_s=0.5)
    assert phase.requests > 0 and phase.errors == 0 and phase.texts == 8 * phase.requests
    assert app[STATE]["texts"] == phase.texts and len(phase.latencies) == phase.requests
    summary = phase.summary()
    assert summary["texts_per_s"] > 0 and summary["p99_ms"] >= summary["p50_ms"] > 0
    async with serving(encoder_app(vectors=None, mode="garbage")) as url:
        bad = await run_phase(url, "all-minilm-l6-v2", texts, name="garbage", clients=2, batch=4, duration_s=0.3)
    assert bad.requests == 0 and bad.errors > 0


def test_the_remote_gateway_points_at_the_encoder_service() -> None:
    settings = gateway_settings(kind="full, cache on", port=1, engine_url="http://127.0.0.1:2", key_hash="h",
                                embedder="remote", log_requests=False, encoder_url="http://127.0.0.1:3",
                                encoder_timeout_ms=250)
    cache = CacheConfig.model_validate(settings["cache"])
    assert cache.semantic.embedder == "remote" and cache.semantic.embed_memo == 0
    assert (cache.semantic.remote.url, cache.semantic.remote.timeout_ms) == ("http://127.0.0.1:3", 250)
