"""The gateway benchmark's stack: its full-stack gateway requires API keys and knows the benchmark tenant's."""

from __future__ import annotations

import httpx

from fleetgate.bench.gateway_overhead import PROMPT, chat_body
from fleetgate.bench.gateway_stack import Pinning, stack
from fleetgate.bench.loadgen import Bodies
from fleetgate.gateway.tenancy.keys import new_key


def test_the_full_stack_gateway_answers_the_benchmark_tenant_and_refuses_others() -> None:
    key, key_hash = new_key()
    with stack(Pinning.choose(None)) as s:
        engine = s.engine()
        gateway = s.gateway(kind="full, cache off", engine_url=engine.url, key_hash=key_hash, embedder="hashing",
                            log_requests=False)
        body = chat_body(PROMPT, temperature=0.8)
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            ok = client.post("/v1/chat/completions", content=body,
                             headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            anonymous = client.post("/v1/chat/completions", content=body,
                                    headers={"Content-Type": "application/json"})
        assert ok.status_code == 200, ok.text
        assert anonymous.status_code == 401
        assert gateway.cpu_s() > 0 and gateway.rss_mb() > 10


def test_bodies_number_each_request_only_when_asked() -> None:
    unique = Bodies(b'{"q": "question __N__"}', start=41)
    assert [unique.next(), unique.next()] == [b'{"q": "question 42"}', b'{"q": "question 43"}']
    fixed = Bodies(b'{"q": "same"}')
    assert fixed.next() == fixed.next() == b'{"q": "same"}'


def test_cache_on_gateways_encode_every_lookup_unless_the_memo_is_asked_for() -> None:
    from fleetgate.bench.gateway_stack import gateway_settings
    from fleetgate.cache.config import CacheConfig

    def cache(embedder: str) -> CacheConfig:
        settings = gateway_settings(kind="full, cache on", port=1, engine_url="http://127.0.0.1:2", key_hash="h",
                                    embedder=embedder, log_requests=False)
        return CacheConfig.model_validate(settings["cache"])

    plain, memo = cache("minilm-onnx-int8"), cache("minilm-onnx-int8+memo")
    assert plain.semantic.embedder == memo.semantic.embedder == "minilm-onnx-int8"
    assert plain.semantic.embed_memo == 0
    assert memo.semantic.embed_memo == CacheConfig().semantic.embed_memo > 0  # as shipped
