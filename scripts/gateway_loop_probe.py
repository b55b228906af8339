"""Run `fleetgate gateway` with its event loop watched: how late the loop runs a timer (its lag: what a request
arriving at a random moment waits before its first callback runs), the cyclic GC's pauses, and the stretches
during which the loop ran nothing else. Written for `scripts/bench_stream_cpu.py --loop-probe`; a file run by
each checkout's own python (it imports only what every checkout of the gateway has: `build_server`).

    python scripts/gateway_loop_probe.py --config gateway.yaml --out stats.json

A timer is set every `--every-ms` (1 ms) and records how late it ran; on SIGTERM the gateway drains as usual and
the figures go to `--out` as JSON: the lag quantiles, the longest lags, and per GC generation the count, the
total and the longest pause (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from pathlib import Path
from typing import Any

import orjson

from fleetgate.core.config import load_model
from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings


class LoopWatch:
    """A chain of timers, each set `every_s` after the previous one ran, recording how late each ran."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.lags: list[float] = []
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._gc_start = 0.0
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopped = False  # the server is shutting down: its drain is not serving
        self._started = 0.0
        self.long_at: list[tuple[float, float]] = []  # (seconds since the start, lag ms) of lags over 50 ms
        self.census = bool(os.environ.get("GATEWAY_PROBE_CENSUS"))  # what the first full collection walks
        self.gen2_types: list[tuple[str, int]] = []

    def _census(self) -> None:
        from collections import Counter

        objects = gc.get_objects(generation=2)
        types = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
        self.gen2_types = [("total", len(objects)), *types.most_common(25)]

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = time.perf_counter()
        gc.callbacks.append(self._on_gc)
        self._arm()

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = time.perf_counter() + self.every_s
        self._loop.call_later(self.every_s, self._tick)

    def _tick(self) -> None:
        if self.stopped:
            return
        now = time.perf_counter()
        lag = max(0.0, now - self._due)
        self.lags.append(lag)
        if lag > 0.05:
            self.long_at.append((round(now - self._started, 2), round(lag * 1e3, 1)))
        self._arm()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self.census and info["generation"] == 2 and not self.gen2_types:
                self._census()
            self._gc_start = time.perf_counter()
        else:
            self.gc[info["generation"]].append(time.perf_counter() - self._gc_start)

    def report(self) -> dict[str, Any]:
        lags = sorted(self.lags)

        def q(x: float) -> float:
            return round(lags[min(len(lags) - 1, int(x * len(lags)))] * 1e3, 3) if lags else float("nan")

        return {"samples": len(lags), "lag_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999),
                                                 "mean": round(sum(lags) / max(1, len(lags)) * 1e3, 3)},
                "longest_lags_ms": [round(x * 1e3, 2) for x in lags[-10:]], "lags_over_50ms_at": self.long_at,
                "gc_ms": {str(g): {"count": len(v), "total": round(sum(v) * 1e3, 2),
                                   "max": round(max(v, default=0.0) * 1e3, 2)} for g, v in self.gc.items()},
                **({"gen2_types": self.gen2_types} if self.gen2_types else {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every-ms", type=float, default=1.0)
    parser.add_argument("--gc-threshold", default=os.environ.get("GATEWAY_PROBE_GC_THRESHOLD", ""),
                        help="A,B,C for gc.set_threshold once serving (default: the gateway's own)")
    args = parser.parse_args()
    settings = load_model(GatewaySettings, args.config)
    server = build_server(settings, freeze_heap=True)
    watch = LoopWatch(args.every_ms / 1000)

    shutdown = server.shutdown

    async def shutdown_then_report(sockets: Any = None) -> None:
        # here rather than after `serve()`: uvicorn re-raises the SIGTERM it caught once `serve()` ends
        watch.stopped = True
        await shutdown(sockets=sockets)
        args.out.write_text(orjson.dumps(watch.report()).decode())

    server.shutdown = shutdown_then_report  # type: ignore[method-assign]

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # start-up (imports, the heap freeze) is not serving
            await asyncio.sleep(0.01)
        if args.gc_threshold:  # an experiment's thresholds, set once the heap is frozen
            gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
        watch.start()
        await task

    import uvloop

    uvloop.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
