"""The simulated engine over HTTP: OpenAI shapes, prefix caching visible in usage, TTFT and metrics."""

from __future__ import annotations

import time

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.sim.fleet import start_sim_fleet
from fleetgate.sim.profile import SimProfile

PROFILE = SimProfile(model="sim-model", prefill_s_per_token=0.0005, time_scale=0.2, default_max_tokens=4)
SYSTEM = "You are a careful assistant for the FleetGate project. " * 40  # ~550 tokens


async def _stream_chat(session: aiohttp.ClientSession, url: str, question: str) -> tuple[float, dict]:
    body = {"model": "sim-model", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 3,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    start = time.perf_counter()
    ttft = None
    usage: dict = {}
    text = ""
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk["choices"]:
                if ttft is None:
                    ttft = time.perf_counter() - start
                text += chunk["choices"][0]["delta"].get("content", "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None and len(text.split()) == 3
    return ttft, usage


async def test_cached_prefix_lowers_ttft_and_is_reported() -> None:
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        cold_ttft, cold = await _stream_chat(s, fleet.urls[0], "What is a KV cache?")
        warm_ttft, warm = await _stream_chat(s, fleet.urls[0], "What is prefix caching?")
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["prompt_tokens_details"]["cached_tokens"] >= 500
    assert warm["completion_tokens"] == 3
    # cold prefill ~0.28 engine-s -> 56 ms wall at time scale 0.2; warm prefills a few tokens
    assert warm_ttft < cold_ttft / 2


async def test_non_streaming_completion_and_errors() -> None:
    async with await start_sim_fleet(replicas=2, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        assert len(set(fleet.urls)) == 2
        async with s.post(f"{fleet.urls[1]}/v1/completions",
                          json={"model": "sim-model", "prompt": "hello " * 30, "max_tokens": 5}) as resp:
            data = await resp.json()
        assert data["object"] == "text_completion"
        assert data["usage"]["completion_tokens"] == 5
        assert data["usage"]["prompt_tokens"] == 45  # 180 chars / 4
        async with s.post(f"{fleet.urls[0]}/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_not_found"
        async with s.get(f"{fleet.urls[0]}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "sim-model"


async def test_metrics_use_vllm_names_and_parse() -> None:
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        await _stream_chat(s, fleet.urls[0], "one")
        await _stream_chat(s, fleet.urls[0], "two")
        async with s.get(f"{fleet.urls[0]}/metrics") as resp:
            text = await resp.text()
    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count"):
        assert name in samples, name
    assert samples["vllm:time_to_first_token_seconds_count"].value == 2
    assert samples["vllm:generation_tokens_total"].value == 6
    assert 0 < samples["vllm:prefix_cache_hits_total"].value < samples["vllm:prefix_cache_queries_total"].value
    assert samples["vllm:num_requests_running"].labels["model_name"] == "sim-model"
    assert samples["vllm:cache_config_info"].labels["num_gpu_blocks"] == str(PROFILE.num_blocks)


async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk() -> None:
    """As vLLM does: without it an abandoned simulated stream could not be billed (6.6% of spend unbilled)."""
    body = {"model": "sim-model", "stream": True, "max_tokens": 4, "prompt": "one two three",
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[0]}/v1/completions", json=body) as resp:
            chunks = [orjson.loads(raw[6:]) async for raw in resp.content
                      if raw.startswith(b"data: {")]
        plain = {**body, "stream_options": {"include_usage": True}}
        async with s.post(f"{fleet.urls[0]}/v1/completions", json=plain) as resp:
            without = [orjson.loads(raw[6:]) async for raw in resp.content if raw.startswith(b"data: {")]
    content = [c for c in chunks if c["choices"]]
    assert content and all(c["usage"]["prompt_tokens"] > 0 for c in content)
    done = [c["usage"]["completion_tokens"] for c in content]
    assert done == sorted(done) and done[-1] == 4
    assert all("usage" not in c for c in without if c["choices"])


async def test_max_completion_tokens_is_read_as_vllm_reads_it() -> None:
    """vLLM 0.32's `CompletionRequest` has no `max_completion_tokens` (an extra field, ignored): a completion
    with `max_tokens: 1, max_completion_tokens: 100000` generates one token. Chat prefers
    `max_completion_tokens` over the deprecated `max_tokens`. The simulator and the fake engine both follow."""
    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

    hostile = {"model": "sim-model", "max_tokens": 1, "max_completion_tokens": 100000}
    fake = await FakeEngine(FakeEngineConfig(model="sim-model")).start()
    try:
        async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
            for url in (fleet.urls[0], fake.url):
                async with s.post(f"{url}/v1/completions", json={**hostile, "prompt": "hello there"}) as resp:
                    assert (await resp.json())["usage"]["completion_tokens"] == 1, url
                chat = {**hostile, "max_completion_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
                async with s.post(f"{url}/v1/chat/completions", json=chat) as resp:
                    assert (await resp.json())["usage"]["completion_tokens"] == 3, url
    finally:
        await fake.stop()
