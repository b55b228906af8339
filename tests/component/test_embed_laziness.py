"""A gateway loads the heavy embedding runtimes only when a request reaches the semantic layer.

Each case runs in a fresh interpreter (the test process itself may have torch loaded) that builds and
serves a real gateway in front of a fake engine, sends the requests, and reports which of onnxruntime,
torch and sentence-transformers are in `sys.modules`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("onnxruntime", "torch", "sentence_transformers")

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    import httpx
    from fleetgate.core.localredis import free_port
    from fleetgate.gateway.serve import build_server
    from fleetgate.gateway.settings import GatewaySettings
    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

    cache, temperature = json.loads(sys.argv[1]), json.loads(sys.argv[2])

    async def main():
        engine = await FakeEngine(FakeEngineConfig(model="m")).start()
        port = free_port()
        settings = GatewaySettings.model_validate({"server": {"port": port, "auth": "open"}, "cache": cache,
                                                   "models": [{"name": "m", "endpoints": [engine.url]}]})
        server = build_server(settings)
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        # The first request that reaches the semantic layer starts loading the verifier's word tables in the
        # background; lookups answer `miss` without embedding until then. Wait for that, so the requests
        # below reach the embedder.
        if temperature == 0 and cache.get("enabled"):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                await client.post("/v1/chat/completions", json={
                    "model": "m", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "warm up"}]})
            await server.config.app.state.stages.cache.warm_up()
        statuses = []
        if temperature is not None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                for text in ("How do I reverse a list in Python?", "How can I reverse a Python list?"):
                    r = await client.post("/v1/chat/completions", json={
                        "model": "m", "max_tokens": 4, "temperature": temperature,
                        "messages": [{"role": "user", "content": text}]})
                    statuses.append([r.status_code, r.headers.get("x-fleetgate-cache")])
        server.should_exit = True
        await task
        await engine.stop()
        heavy = [m for m in ("onnxruntime", "torch", "sentence_transformers") if m in sys.modules]
        print(json.dumps({"heavy": heavy, "statuses": statuses}))

    asyncio.run(main())
""")


def serve_and_report(cache: dict[str, object], temperature: float | None) -> dict[str, list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(cache), json.dumps(temperature)],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_a_gateway_with_the_cache_off_never_loads_an_embedding_runtime() -> None:
    report = serve_and_report({"enabled": False}, temperature=0)
    assert report["statuses"] == [[200, "bypass"], [200, "bypass"]]  # NoCache answers bypass
    assert report["heavy"] == []


def test_bypassed_traffic_leaves_the_onnx_embedder_unloaded() -> None:
    report = serve_and_report({"enabled": True, "semantic": {"embedder": "minilm-onnx"}}, temperature=0.8)
    assert report["statuses"] == [[200, "bypass"], [200, "bypass"]]
    assert report["heavy"] == []


@pytest.mark.slow
@pytest.mark.parametrize("stored", [False, True], ids=["nothing-near", "paraphrase-of-a-stored-answer"])
def test_a_semantic_lookup_loads_onnxruntime_but_not_torch(stored: bool) -> None:
    # max_tokens 4 ends in "length": stored only with store_truncated. Without it the index stays empty and
    # the static prefilter spares the encoder (tests/unit/test_cache_prefilter.py counts encodes); the
    # verifier's token states still load with the semantic layer (the shipped pair model uses them).
    cache: dict[str, object] = {"enabled": True, "store_truncated": stored, "semantic": {"embedder": "minilm-onnx"}}
    report = serve_and_report(cache, temperature=0)
    assert [s[0] for s in report["statuses"]] == [200, 200]
    assert report["statuses"][0][1] == "miss"
    assert report["heavy"] == ["onnxruntime"]
