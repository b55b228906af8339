"""Scale from zero in the gateway (`fleetgate.gateway.wake.Waker`) over a fake wakeable endpoint source."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleetgate.core.errors import UpstreamUnavailableError
from fleetgate.core.types import Endpoint
from fleetgate.gateway.discovery import EndpointSource, ModelListing, WakeableSource, WakeTarget, listing
from fleetgate.gateway.settings import ScaleFromZeroSettings
from fleetgate.gateway.wake import Waker

EP = Endpoint(id="10.0.0.1:8000", url="http://10.0.0.1:8000", model="m")


class FakeSource:
    """One model `m` scaled to zero; a scale call makes an endpoint ready after `ready_after_s` (never: None)."""

    def __init__(self, *, ready_after_s: float | None = 0.05, wakeable: bool = True, fail: bool = False) -> None:
        self.ready_after_s = ready_after_s
        self.wakeable = wakeable
        self.fail = fail
        self.ready: list[Endpoint] = []
        self.scale_calls: list[WakeTarget] = []
        self.marks: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []

    def models(self) -> list[str]:
        return ["m"]

    def endpoints(self, model: str) -> list[Endpoint]:
        return list(self.ready) if model == "m" else []

    def wake_targets(self, model: str) -> list[WakeTarget]:
        return [WakeTarget(namespace="ml", name="m-isvc", replicas=2)] if self.wakeable and model == "m" else []

    async def scale(self, target: WakeTarget) -> None:
        self.scale_calls.append(target)
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("403 Forbidden: inferenceservices/scale")
        if self.ready_after_s is not None:
            self._tasks.append(asyncio.create_task(self._become_ready(self.ready_after_s)))

    async def _become_ready(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.ready = [EP]

    async def mark_active(self, model: str) -> None:
        self.marks.append(model)


def _waker(source: Any, **settings: Any) -> Waker:
    return Waker(source=source, settings=ScaleFromZeroSettings(**{"poll_s": 0.01, **settings}))


def test_fake_source_is_a_wakeable_endpoint_source() -> None:
    assert isinstance(FakeSource(), EndpointSource) and isinstance(FakeSource(), WakeableSource)


async def test_many_held_requests_share_one_scale_call_and_all_proceed() -> None:
    source = FakeSource(ready_after_s=0.1)
    waker = _waker(source)
    tasks = [asyncio.create_task(waker.endpoints("m")) for _ in range(50)]
    await asyncio.sleep(0.05)
    assert waker.held("m") == 50  # all held, none answered yet
    results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert results == [[EP]] * 50
    assert source.scale_calls == [WakeTarget(namespace="ml", name="m-isvc", replicas=2)]  # one call, not 50
    assert waker.held("m") == 0
    assert source.marks == ["m"]  # the activity mark is rate-limited too
    await waker.aclose()


async def test_time_out_is_503_with_retry_after_and_releases_the_hold() -> None:
    source = FakeSource(ready_after_s=None)  # scaled up, but never gets a ready pod
    waker = _waker(source, wait_s=0.2, retry_after_s=7)
    with pytest.raises(UpstreamUnavailableError) as err:
        await waker.endpoints("m")
    assert err.value.status == 503 and err.value.headers["Retry-After"] == "7"
    assert "'m'" in err.value.message and "0.2 s" in err.value.message
    assert waker.held("m") == 0
    assert len(source.scale_calls) == 1
    await asyncio.sleep(0.05)  # the hold's poll loop is gone with its last waiter
    assert not [t for t in asyncio.all_tasks() if "_wake" in repr(t.get_coro())]


async def test_a_client_that_leaves_while_held_leaves_nothing_behind() -> None:
    source = FakeSource(ready_after_s=None)
    waker = _waker(source, wait_s=30)
    held = [asyncio.create_task(waker.endpoints("m")) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert waker.held("m") == 3
    held[0].cancel()
    await asyncio.sleep(0.01)
    assert waker.held("m") == 2  # the others still wait
    for task in held[1:]:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert waker.held("m") == 0
    await asyncio.sleep(0.02)
    assert not [t for t in asyncio.all_tasks() if "_wake" in repr(t.get_coro())]
    # A later request opens a new hold: one more scale call, and it proceeds once ready.
    source.ready_after_s = 0.01
    assert await asyncio.wait_for(waker.endpoints("m"), 5) == [EP]
    assert len(source.scale_calls) == 2


async def test_held_requests_are_capped_per_model() -> None:
    waker = _waker(FakeSource(ready_after_s=None), wait_s=30, max_held_per_model=2)
    held = [asyncio.create_task(waker.endpoints("m")) for _ in range(2)]
    await asyncio.sleep(0.02)
    with pytest.raises(UpstreamUnavailableError) as err:
        await waker.endpoints("m")
    assert "too many requests" in err.value.message and "Retry-After" in err.value.headers
    assert waker.held("m") == 2
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert waker.held("m") == 0


async def test_a_failed_scale_call_fails_the_held_requests_at_once_and_is_retried_next_time() -> None:
    source = FakeSource(fail=True)
    waker = _waker(source, wait_s=30)
    results = await asyncio.wait_for(asyncio.gather(*(waker.endpoints("m") for _ in range(5)),
                                                    return_exceptions=True), 5)
    assert all(isinstance(r, UpstreamUnavailableError) and "could not be woken" in r.message for r in results)
    assert len(source.scale_calls) == 1 and waker.held("m") == 0
    source.fail = False
    assert await asyncio.wait_for(waker.endpoints("m"), 5) == [EP]
    assert len(source.scale_calls) == 2


async def test_models_that_cannot_be_woken_or_are_ready_are_not_held() -> None:
    source = FakeSource(wakeable=False)
    waker = _waker(source)
    assert await waker.endpoints("m") == []  # the forwarder answers 503: no scale call, no wait
    assert source.scale_calls == [] and source.marks == []
    ready = FakeSource()
    ready.ready = [EP]
    waker = _waker(ready)
    assert await waker.endpoints("m") == [EP]
    await asyncio.sleep(0.01)  # the mark is written in the background
    assert ready.scale_calls == [] and ready.marks == ["m"]  # a ready model's requests still mark it active
    off = FakeSource()
    assert await _waker(off, enabled=False).endpoints("m") == [] and off.scale_calls == []
    await waker.aclose()


def test_listing_falls_back_to_every_known_model() -> None:
    source = FakeSource()
    assert listing(source) == [ModelListing(name="m", ready=False)]


async def test_calls_in_flight_keep_a_model_marked_active_until_they_end() -> None:
    source = FakeSource()
    source.ready = [EP]
    waker = _waker(source, active_mark_s=0.05)
    assert await waker.endpoints("m") == [EP]
    waker.begin("m")  # a long generation
    await asyncio.sleep(0.3)
    assert len(source.marks) >= 4  # the start mark, then a heartbeat every 0.05 s
    waker.end("m")
    assert waker.in_flight("m") == 0
    await asyncio.sleep(0.1)
    settled = len(source.marks)
    await asyncio.sleep(0.2)
    assert len(source.marks) == settled  # no calls in flight: no more marks
    waker.begin("other")  # a model that cannot be woken is never counted
    assert waker.in_flight("other") == 0
    waker.begin("m")
    waker.end("m")  # the heartbeat is sleeping now, with nothing in flight
    await waker.drain()  # at shutdown: nothing of the waker is left running
    assert not [t for t in asyncio.all_tasks() if "_beat" in repr(t.get_coro()) and not t.done()]
