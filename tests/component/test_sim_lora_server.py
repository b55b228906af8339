"""The simulated engine's LoRA face over HTTP, driven by the shared vLLM client (`fleetgate.engine.lora_api`):
adapters listed with their base, served by name, loaded and unloaded at runtime, and the engine-side
costs visible (load latency, `vllm:lora_requests_info`)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.engine.lora_api import AdapterApiError, load_adapter, loaded_adapters, unload_adapter
from fleetgate.sim.fleet import start_sim_fleet
from fleetgate.sim.profile import SimProfile

PROFILE = SimProfile(
    model="base-model",
    time_scale=0.1,
    default_max_tokens=3,
    enable_lora=True,
    max_loras=2,
    allow_runtime_lora_updating=True,
    lora_load_s=1.0,
    lora_modules=(("sql", "/adapters/sql"),),
)


async def _complete(s: aiohttp.ClientSession, url: str, model: str) -> tuple[int, dict]:
    async with s.post(f"{url}/v1/completions", json={"model": model, "prompt": "hello " * 20, "max_tokens": 2}) as r:
        return r.status, await r.json()


async def test_adapters_are_listed_with_their_base_and_served_by_name() -> None:
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        listed = await loaded_adapters(s, url)
        assert [(a.name, a.base, a.source) for a in listed] == [("sql", "base-model", "/adapters/sql")]
        status, body = await _complete(s, url, "sql")
        assert status == 200 and body["model"] == "sql" and body["usage"]["completion_tokens"] == 2
        status, body = await _complete(s, url, "base-model")
        assert status == 200 and body["model"] == "base-model"
        status, body = await _complete(s, url, "not-loaded")
        assert status == 404 and "does not exist" in body["error"]["message"]


async def test_runtime_load_takes_the_load_latency_then_serves_and_unload_removes_it() -> None:
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        t0 = time.perf_counter()
        await load_adapter(s, url, name="chat", source="/adapters/chat")
        took = time.perf_counter() - t0
        assert took >= PROFILE.lora_load_s * PROFILE.time_scale * 0.9  # 1 engine-second at time scale 0.1
        assert {a.name for a in await loaded_adapters(s, url)} == {"sql", "chat"}
        assert (await _complete(s, url, "chat"))[0] == 200
        await load_adapter(s, url, name="chat", source="/adapters/chat")  # vLLM's 400 "already loaded": idempotent
        async with s.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": "/x"}) as r:
            assert r.status == 400 and "already been loaded" in (await r.json())["error"]["message"]
        await unload_adapter(s, url, name="chat")
        assert {a.name for a in await loaded_adapters(s, url)} == {"sql"}
        assert (await _complete(s, url, "chat"))[0] == 404
        async with s.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "chat"}) as r:
            assert r.status == 404


async def test_hostile_load_bodies_get_400_and_leave_the_engine_serving() -> None:
    async with await start_sim_fleet(replicas=1, profile=PROFILE) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        for body in (
            b"not json",
            b"[1, 2]",
            b'{"lora_name": 5, "lora_path": "/x"}',
            b'{"lora_name": "x"}',
            b'{"lora_name": "base-model", "lora_path": "/x"}',
        ):
            async with s.post(f"{url}/v1/load_lora_adapter", data=body) as r:
                assert r.status == 400, body
        with pytest.raises(AdapterApiError) as big:
            # rank 64 > --max-lora-rank 16: the sim reads `r` from peft's adapter_config.json
            await load_adapter(s, url, name="big", source=_write_adapter(rank=64))
        assert big.value.status == 400
        async with s.post(f"{url}/v1/unload_lora_adapter", data=b"{}") as r:
            assert r.status == 400
        assert (await _complete(s, url, "sql"))[0] == 200


def _write_adapter(*, rank: int) -> str:
    import json
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="sim-lora-"))
    (path / "adapter_config.json").write_text(json.dumps({"r": rank}))
    return str(path)


async def test_runtime_api_needs_the_flag_and_lora_requests_info_is_exported() -> None:
    closed = PROFILE.with_(allow_runtime_lora_updating=False)
    async with await start_sim_fleet(replicas=1, profile=closed) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        with pytest.raises(AdapterApiError):
            await load_adapter(s, url, name="chat", source="/adapters/chat")
        assert (await _complete(s, url, "sql"))[0] == 200
        assert _lora_info(await _metrics(s, url))["running_lora_adapters"] == ""
        long = asyncio.create_task(
            s.post(f"{url}/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 40})
        )
        try:
            labels: dict[str, str] = {}
            for _ in range(100):
                labels = _lora_info(await _metrics(s, url))
                if labels["running_lora_adapters"]:
                    break
                await asyncio.sleep(0.01)
            assert labels["running_lora_adapters"] == "sql" and labels["max_lora"] == "2"
        finally:
            (await long).close()


async def _metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(f"{url}/metrics") as r:
        return await r.text()


def _lora_info(text: str) -> dict[str, str]:
    info = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:lora_requests_info"
    ]
    assert len(info) == 1
    return dict(info[0].labels)
