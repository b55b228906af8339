"""`charsPerToken: auto` through a real gateway: the router learns the characters per token the engine's usage
reports, streamed and not, and exports it on the metrics port."""

from __future__ import annotations

import re

import httpx

from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway

# The fake engine counts one token per word: words of 5 and 6 letters, each followed by a space, are 6.5 characters
# per token (the gateway routes a completions prompt as its text).
WORDS = "alpha bravos "
GAUGE = re.compile(r'^fleetgate_router_chars_per_token\{model="m1"\} (\S+)$', re.M)


async def test_the_gauge_reads_the_engines_chars_per_token_after_enough_requests(
    gateway: RunningGateway, engine: FakeEngine
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        for i in range(12):
            prompt = f"{WORDS * (20 + i)}"  # 40-62 tokens
            r = await client.post("/v1/completions", json={"model": "m1", "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2 * (20 + i)
        early = (await client.get(gateway.metrics_url)).text
        for i in range(12):  # streamed: the usage comes in the stream's chunks
            body = {"model": "m1", "prompt": WORDS * (30 + i), "max_tokens": 2, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                _ = [line async for line in r.aiter_lines()]
        for _ in range(5):  # under 16 tokens: not learned from (mostly template in a real chat)
            await client.post("/v1/completions", json={"model": "m1", "prompt": "x" * 400, "max_tokens": 2})
        metrics = (await client.get(gateway.metrics_url)).text
    assert GAUGE.search(early) is None  # 12 requests: not learned yet, the fallback stands
    found = GAUGE.search(metrics)
    assert found is not None and abs(float(found.group(1)) - 6.5) < 0.01
    assert engine.stats.completed >= 29
