"""The benchmark's per-stage timestamps inside a gateway (`fleetgate.bench.first_token_stages`)."""

from __future__ import annotations

import asyncio
import gc

from fleetgate.bench.first_token_stages import SPANS, Stamps

KEYS = ["t0", "auth0", "auth1", "admit0", "admit1", "route0", "route1", "up", "hdr", "first", "sent"]


async def test_a_request_that_never_awaits_before_the_engine_call_did_not_yield() -> None:
    stamps = Stamps()
    stamps.begin()
    stamps.mark("up")
    [row] = [stamps.current.get()]
    assert row["yielded"] == 0.0
    stamps.begin()
    await asyncio.sleep(0)  # one turn of the loop: the callback scheduled at arrival runs
    stamps.mark("up")
    assert stamps.current.get()["yielded"] == 1.0


async def test_wrap_stamps_both_ends_of_a_method_and_keeps_its_result() -> None:
    class Stage:
        async def run(self, x: int) -> int:
            await asyncio.sleep(0.01)
            return x + 1

    stamps = Stamps()
    stamps.wrap(Stage, "run", "stage")
    row = stamps.begin()
    assert await Stage().run(1) == 2
    assert row["stage1"] - row["stage0"] >= 0.009


def test_summary_reports_medians_of_each_span_after_the_warm_up() -> None:
    stamps = Stamps()
    warm = {k: float(i) * 100 for i, k in enumerate(KEYS)}  # skipped: 100 ms a span
    stamps.rows = [warm] + [{**{k: i * (0.001 + j * 0.001) for i, k in enumerate(KEYS)}, "yielded": 0.0}
                            for j in range(3)]
    out = stamps.summary(skip=1)
    assert out["requests"] == 3
    # every adjacent span is the middle row's 2 ms; "arrival -> engine call" spans 7 steps
    assert out["auth"] == 2.0 and out["first chunk write"] == 2.0
    assert out["arrival -> engine call"] == 14.0
    assert out["share yielding to the loop before the engine call"] == 0.0
    assert {label for label, _, _ in SPANS} <= out.keys()


def test_collections_are_counted_from_the_first_request_on() -> None:
    stamps = Stamps()
    stamps.gc_timed()
    try:
        gc.collect()
        assert stamps.gc_count == [0, 0, 0]  # start-up: nothing served yet
        stamps.rows.append({})
        gc.collect()
        assert stamps.gc_count[2] == 1 and stamps.gc_ms[2] > 0
    finally:
        gc.callbacks.pop()
