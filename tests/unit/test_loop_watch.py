"""The loop watch of the live benchmarks' gateway (`fleetgate.bench.loop_watch`): a callback that blocks the loop
shows as a lag that long, a collection as a pause of its generation, and a summary keeps only its window."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

from fleetgate.bench.loop_watch import LoopWatch, load_summary, summary


async def test_a_blocked_loop_and_a_collection_are_seen_with_their_times(tmp_path: Path) -> None:
    watch = LoopWatch(every_s=0.002)
    watch.start()
    await asyncio.sleep(0.05)
    blocked_at = time.time()
    time.sleep(0.04)  # noqa: ASYNC251 (on purpose: the loop runs nothing else for 40 ms)
    await asyncio.sleep(0.02)
    gc.collect(1)
    await asyncio.sleep(0.01)
    watch.stop()
    watch.dump(tmp_path / "loop.json")
    whole = load_summary(tmp_path / "loop.json")
    assert whole is not None
    assert whole["samples"] > 20
    assert 35 <= whole["lag_ms"]["max"] < 1000 and whole["lag_ms"]["p50"] < 20
    assert whole["gc"]["1"]["count"] >= 1
    before = load_summary(tmp_path / "loop.json", until=blocked_at)  # the window before the block
    assert before is not None and before["lag_ms"]["max"] is not None and before["lag_ms"]["max"] < 35
    assert load_summary(tmp_path / "nothing.json") is None


def test_an_empty_window_has_no_figures() -> None:
    out = summary({"every_s": 0.005, "samples": [(10.0, 0.001)], "pauses": [(10.0, 0, 0.002)]}, since=20.0)
    assert out["samples"] == 0 and out["lag_ms"]["max"] is None and out["gc"]["0"]["count"] == 0
