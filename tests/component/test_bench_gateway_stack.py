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


def test_varied_questions_are_distinct_and_bodies_fill_them_in() -> None:
    from fleetgate.bench.loadgen import varied_prompt

    prompts = {varied_prompt(n) for n in range(76_800)}
    assert len(prompts) == 76_800 and varied_prompt(76_800) == varied_prompt(0)
    assert varied_prompt(0) == "How do I sort a list in Python without a library?"
    varied = Bodies(b'{"q": "__V__"}', start=4)
    assert varied.next() == b'{"q": "%s"}' % varied_prompt(5).encode()


def test_wrk_sends_the_same_varied_questions_as_the_python_load_generator() -> None:
    """The throughput phase runs wrk with a Lua port of `varied_prompt`: it must send those questions."""
    import json
    import shutil
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import pytest

    from fleetgate.bench.loadgen import run_wrk, varied_prompt

    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (scripts/install installs it)")
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(json.loads(body)["messages"][0]["content"])
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        phase = run_wrk(f"http://127.0.0.1:{server.server_port}", chat_body("__V__", temperature=0.0),
                        concurrency=1, duration_s=1, start=1000)
    finally:
        server.shutdown()
    assert phase.done >= 10 and len(seen) >= 10
    # wrk calls `request()` once more to check the script before sending: its counter may have moved on one
    first = next(n for n in (1001, 1002) if varied_prompt(n) == seen[0])
    assert seen == [varied_prompt(first + i) for i in range(len(seen))]
