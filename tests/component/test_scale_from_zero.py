"""Scale from zero through a gateway on a real server: a simulated engine appears once the gateway scales
its InferenceService up; `/v1/models` offers only models a client can be served."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from fleetgate.core.types import Endpoint
from fleetgate.gateway.discovery import ModelListing, WakeTarget
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import eventually, settings_for

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hello there friend"}], "max_tokens": 3}


class ScaledToZero:
    """Discovery of `m1` (scaled to zero, wakeable), `gone` (no endpoints, cannot be woken) and `up` (ready)."""

    def __init__(self, engine_url: str, *, ready_after_s: float | None) -> None:
        self.engine = Endpoint(id="engine", url=engine_url, model="m1")
        self.ready_after_s = ready_after_s
        self.ready: list[Endpoint] = []
        self.scale_calls: list[WakeTarget] = []

    def models(self) -> list[str]:
        return ["gone", "m1", "up"]

    def endpoints(self, model: str) -> list[Endpoint]:
        if model == "up":
            return [Endpoint(id="up", url=self.engine.url, model="m1")]
        return list(self.ready) if model == "m1" else []

    def listing(self) -> list[ModelListing]:
        return [ModelListing(name="m1", ready=bool(self.ready), scaled_to_zero=not self.ready),
                ModelListing(name="up", ready=True)]

    def wake_targets(self, model: str) -> list[WakeTarget]:
        return [WakeTarget(namespace="ml", name="m1")] if model == "m1" else []

    async def scale(self, target: WakeTarget) -> None:
        self.scale_calls.append(target)
        if self.ready_after_s is not None:
            asyncio.get_running_loop().call_later(self.ready_after_s, self.ready.append, self.engine)

    async def mark_active(self, model: str) -> None:
        return None


async def _gateway(start_gateway: Any, source: ScaledToZero, **scale_from_zero: Any) -> Any:
    settings = settings_for({}, scale_from_zero={"poll_s": 0.01, **scale_from_zero})
    return await start_gateway(settings, endpoint_source=source)


async def test_models_lists_only_what_can_be_served(start_gateway: Any, engine: FakeEngine) -> None:
    gw = await _gateway(start_gateway, ScaledToZero(engine.url, ready_after_s=None))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        data = (await client.get("/v1/models")).json()["data"]
        gone = await client.post("/v1/chat/completions", json={**CHAT, "model": "gone"})
    assert [(m["id"], m["fleetgate"]) for m in data] == [
        ("m1", {"ready": False, "scaled_to_zero": True}),
        ("up", {"ready": True, "scaled_to_zero": False}),
    ]
    # Known but not offered (no endpoint, cannot be woken): 503 with Retry-After, never 404.
    assert gone.status_code == 503 and gone.headers["retry-after"] == "10"
    assert gone.json()["error"]["code"] == "upstream_unavailable"


async def test_held_requests_all_proceed_after_one_scale_call(start_gateway: Any, engine: FakeEngine) -> None:
    source = ScaledToZero(engine.url, ready_after_s=1.0)  # every request arrives before it is ready
    gw = await _gateway(start_gateway, source)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        answers = await asyncio.gather(*(client.post("/v1/chat/completions", json=CHAT) for _ in range(20)))
    assert [r.status_code for r in answers] == [200] * 20
    assert len(source.scale_calls) == 1
    assert gw.pipeline.waker.held("m1") == 0
    registry = gw.app.state.registry
    # One wake for the twenty requests it held (defect: the wakes metric counted held requests).
    assert registry.get_sample_value("fleetgate_scale_from_zero_wakes_total", {"model": "m1", "outcome": "ready"}) == 1
    assert registry.get_sample_value("fleetgate_scale_from_zero_requests_total",
                                     {"model": "m1", "outcome": "ready"}) == 20
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    # Every engine call that began has ended: nothing keeps the model marked active.
    assert await eventually(lambda: gw.pipeline.waker.in_flight("m1") == 0)


async def test_time_out_is_503_with_retry_after(start_gateway: Any, engine: FakeEngine) -> None:
    source = ScaledToZero(engine.url, ready_after_s=None)
    gw = await _gateway(start_gateway, source, wait_s=0.3, retry_after_s=5)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "scaled to zero" in r.json()["error"]["message"] and "ml" not in r.json()["error"]["message"]
    assert gw.pipeline.waker.held("m1") == 0
    registry = gw.app.state.registry
    wakes = registry.get_sample_value("fleetgate_scale_from_zero_wakes_total", {"model": "m1", "outcome": "timeout"})
    assert wakes == 1


async def test_a_client_that_leaves_while_held_is_released(start_gateway: Any, engine: FakeEngine) -> None:
    source = ScaledToZero(engine.url, ready_after_s=None)
    gw = await _gateway(start_gateway, source, wait_s=60)
    async with httpx.AsyncClient(base_url=gw.url, timeout=0.3) as client:
        try:
            await client.post("/v1/chat/completions", json=CHAT)
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("a held request must not be answered")
    assert await eventually(lambda: gw.pipeline.waker.held("m1") == 0)
    registry = gw.app.state.registry
    assert await eventually(lambda: registry.get_sample_value("fleetgate_requests_in_flight") == 0)

    def left() -> float:
        return sum(s.value for metric in registry.collect() for s in metric.samples
                   if s.name == "fleetgate_requests_total" and s.labels.get("status") == "499")

    assert await eventually(lambda: left() == 1)
    assert registry.get_sample_value("fleetgate_scale_from_zero_held_requests", {"model": "m1"}) == 0
    assert registry.get_sample_value("fleetgate_scale_from_zero_wakes_total",
                                     {"model": "m1", "outcome": "abandoned"}) == 1
    assert registry.get_sample_value("fleetgate_scale_from_zero_requests_total",
                                     {"model": "m1", "outcome": "abandoned"}) == 1
    assert not engine.received  # never reached an engine


async def test_a_long_generation_counts_as_in_flight_until_it_ends(start_gateway: Any, start_engine: Any) -> None:
    slow = await start_engine(model="m1", inter_token_delay_s=0.1)
    source = ScaledToZero(slow.url, ready_after_s=0.0)
    gw = await _gateway(start_gateway, source)
    long = {**CHAT, "stream": True, "max_tokens": 8}
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client, client.stream(
        "POST", "/v1/chat/completions", json=long
    ) as r:
        assert r.status_code == 200
        assert await eventually(lambda: gw.pipeline.waker.in_flight("m1") == 1)
        body = b"".join([chunk async for chunk in r.aiter_bytes()])
    assert b"[DONE]" in body
    assert await eventually(lambda: gw.pipeline.waker.in_flight("m1") == 0)
