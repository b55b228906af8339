"""Watching a server's event loop from inside its process: how late it runs a timer, and the cyclic GC's pauses.

A timer is set `every_s` after the previous one ran; how late each runs (its lag) is about what a request arriving
at that moment waits before its first callback: the loop was busy with other callbacks (a burst of stream chunks,
a collection). Each sample and each collection is kept with its wall-clock time, so a benchmark can summarise the
window it loaded (`summary(since=..., until=...)`) from the file `dump` writes when the server stops. The gateway
of the live benchmarks (`live_gateway.serve`) runs one (every 5 ms: ~200 callbacks a second, a negligible share of
its CPU); `scripts/gateway_loop_probe.py` runs one every millisecond for `scripts/bench_stream_cpu.py`.
Only the standard library: that script loads this file by path into any checkout's python.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any


class LoopWatch:
    def __init__(self, every_s: float = 0.005) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (wall time, lag s)
        self.pauses: list[tuple[float, int, float]] = []  # (wall time, generation, pause s)
        self.stopped = False
        self._gc_start = 0.0
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start watching the running loop."""
        self._loop = asyncio.get_running_loop()
        gc.callbacks.append(self._on_gc)
        self._arm()

    def stop(self) -> None:
        self.stopped = True
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = time.perf_counter() + self.every_s
        self._loop.call_later(self.every_s, self._tick)

    def _tick(self) -> None:
        if self.stopped:
            return
        self.samples.append((time.time(), max(0.0, time.perf_counter() - self._due)))
        self._arm()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.pauses.append((time.time(), int(info["generation"]), time.perf_counter() - self._gc_start))

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"every_s": self.every_s, "samples": self.samples, "pauses": self.pauses}))


def summary(data: dict[str, Any], *, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
    """Lag quantiles and the longest lag (ms), and per GC generation the collections, their total and longest pause
    (ms), of what `LoopWatch.dump` wrote, between wall times `since` and `until`."""
    lags = sorted(lag for t, lag in data["samples"] if since <= t <= until)
    pauses = [(gen, p) for t, gen, p in data["pauses"] if since <= t <= until]

    def q(x: float) -> float | None:
        return round(lags[min(len(lags) - 1, int(x * len(lags)))] * 1e3, 3) if lags else None

    return {"every_ms": data["every_s"] * 1e3, "samples": len(lags),
            "lag_ms": {"mean": round(sum(lags) / len(lags) * 1e3, 3) if lags else None,
                       "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0)},
            "gc": {str(gen): {"count": len(ps), "total_ms": round(sum(ps) * 1e3, 2),
                              "max_ms": round(max(ps, default=0.0) * 1e3, 2)}
                   for gen in (0, 1, 2) for ps in ([p for g, p in pauses if g == gen],)}}


def load_summary(path: Path, *, since: float = 0.0, until: float = float("inf")) -> dict[str, Any] | None:
    """`summary` of the file at `path`; None when there is none (the server did not write it)."""
    if not path.exists():
        return None
    return summary(json.loads(path.read_text()), since=since, until=until)
