"""The cost benchmarks' request replay stops by itself: a request that times out is an error outcome (not
the end of the run), and a cancelled replay (Ctrl-C) cancels the requests still in flight."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from fleetgate.bench.cost_run import replay, stop_gateway
from fleetgate.bench.workload import WorkItem, Workload
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig


def _item(at_s: float) -> WorkItem:
    return WorkItem(at_s=at_s, tenant="t", messages=({"role": "user", "content": "hi"},), answer_key="k",
                    needs_tier="small", kind="support", max_tokens=4)


async def test_a_request_that_times_out_is_an_error_outcome_and_the_replay_goes_on() -> None:
    engine = await FakeEngine(FakeEngineConfig(hang_after_chunks=1)).start()
    try:
        timeout = aiohttp.ClientTimeout(total=0.5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            outcomes = await replay(session, f"{engine.url}/v1/chat/completions", Workload(seed=0, items=[_item(0.0)]),
                                    model_of=lambda _: "m", keys={"t": "k"}, time_scale=1.0)
    finally:
        await engine.stop()
    assert len(outcomes) == 1 and outcomes[0].status == 0 and outcomes[0].error


async def test_a_cancelled_replay_cancels_the_requests_in_flight() -> None:
    engine = await FakeEngine(FakeEngineConfig(hang_after_chunks=0)).start()
    try:
        async with aiohttp.ClientSession() as session:
            workload = Workload(seed=0, items=[_item(0.0), _item(60.0)])
            task = asyncio.create_task(replay(session, f"{engine.url}/v1/chat/completions", workload,
                                              model_of=lambda _: "m", keys={"t": "k"}, time_scale=1.0))
            for _ in range(500):  # until the first request reached the engine (at most 5 s)
                if engine.stats.requests:
                    break
                await asyncio.sleep(0.01)
            assert engine.stats.requests == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            requests = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "_one"]  # type: ignore[union-attr]
            assert requests == []  # no request left running
    finally:
        await engine.stop()


async def test_stop_gateway_does_nothing_for_a_gateway_that_never_started() -> None:
    await stop_gateway(None, None)
