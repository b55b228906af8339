"""The fake engine's step clock (`step_sync`): streams started apart get their tokens at the same instants, one
burst per step, as a GPU engine's batched decode steps hand every running sequence its token at once (what
`scripts/bench_stream_cpu.py --step-sync` puts in front of the gateway)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

STEP_S = 0.1


async def token_times(session: aiohttp.ClientSession, url: str, *, delay_s: float) -> list[float]:
    """perf_counter times of a stream's content chunks, the stream started after `delay_s`."""
    await asyncio.sleep(delay_s)
    body = orjson.dumps({"model": "m", "prompt": "a b", "max_tokens": 5, "stream": True})
    times: list[float] = []
    async with session.post(url + "/v1/completions", data=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return times


async def run(step_sync: bool) -> float:
    """How far apart the two streams' paced tokens come (after the first, which is not paced): for each of the
    second stream's, the distance to the nearest of the first's, the largest of these. (On the step clock the k-th
    tokens of two streams may be a whole step apart: one started just before a step, one just after.)"""
    engine = await FakeEngine(FakeEngineConfig(model="m", inter_token_delay_s=STEP_S, step_sync=step_sync)).start()
    try:
        async with aiohttp.ClientSession() as session:
            a, b = await asyncio.gather(token_times(session, engine.url, delay_s=0.0),
                                        token_times(session, engine.url, delay_s=0.5 * STEP_S))
    finally:
        await engine.stop()
    assert len(a) == len(b) == 5
    return max(min(abs(x - y) for x in a[1:]) for y in b[1:-1])


async def test_streams_on_the_step_clock_get_their_tokens_together() -> None:
    assert await run(step_sync=True) < 0.25 * STEP_S  # the same step (the second stream joined mid-step)
    assert await run(step_sync=False) > 0.25 * STEP_S  # each stream's own clock: still half a step apart
