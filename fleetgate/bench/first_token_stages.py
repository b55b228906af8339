"""Where a gateway request's time goes before it reaches the engine, measured inside the gateway process.

`python -m fleetgate.bench.first_token_stages CONFIG OUT` runs the live benchmark's gateway
(`live_gateway.serve`, default routing) with timestamps taken, per `POST`, at: arrival in the app, the
authentication's start and end, admission's start and end (parse, authorize, reserve, cache lookup, tier),
routing's start and end (filters, scorers, picker, prefix hashing), the call to the engine client, its response
headers, the first body chunk handed to the server and that write's return; plus whether the request gave the
event loop a turn between arrival and the engine call (a callback scheduled at arrival has run by then), and the
garbage collector's pauses from the first request on.
On SIGUSR1 it writes the medians (ms) over the requests so far to OUT (JSON). Only the benchmark uses this:
the timestamps wrap a few methods of the app (by assignment, in this child alone); the gateway has none.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

SPANS = [("arrival -> auth", "t0", "auth0"), ("auth", "auth0", "auth1"), ("body + context", "auth1", "admit0"),
         ("admission", "admit0", "admit1"), ("tier -> routing", "admit1", "route0"), ("routing", "route0", "route1"),
         ("routing -> engine call", "route1", "up"), ("arrival -> engine call", "t0", "up"),
         ("engine call -> headers", "up", "hdr"), ("headers -> first chunk written", "hdr", "first"),
         ("first chunk write", "first", "sent")]


class Stamps:
    """Per-request timestamps (a dict per request, found through a context variable)."""

    def __init__(self) -> None:
        self.current: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("stamps")
        self.rows: list[dict[str, float]] = []
        self.gc_count = [0, 0, 0]
        self.gc_ms = [0.0, 0.0, 0.0]
        self.gc_max_ms = 0.0

    def begin(self) -> dict[str, float]:
        row = {"t0": time.perf_counter(), "turned": 0.0}
        asyncio.get_running_loop().call_soon(row.__setitem__, "turned", 1.0)
        self.current.set(row)
        return row

    def mark(self, key: str) -> None:
        row = self.current.get(None)
        if row is not None:
            row[key] = time.perf_counter()
            if key == "up":
                row["yielded"] = row["turned"]

    def wrap(self, owner: Any, name: str, key: str) -> None:
        original: Callable[..., Awaitable[Any]] = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            self.mark(key + "0")
            try:
                return await original(*args, **kwargs)
            finally:
                self.mark(key + "1")

        setattr(owner, name, timed)

    def gc_timed(self) -> None:
        """Time the interpreter's garbage collections (per generation: count and total ms)."""
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started[:] = [time.perf_counter()]
            elif started and self.rows:  # from the first request served on (not the start-up's collections)
                gen = info["generation"]
                pause = 1000 * (time.perf_counter() - started[0])
                self.gc_count[gen] += 1
                self.gc_ms[gen] += pause
                self.gc_max_ms = max(self.gc_max_ms, pause)

        gc.callbacks.append(on_gc)

    def summary(self, *, skip: int = 20) -> dict[str, Any]:
        rows = [r for r in self.rows[skip:] if "sent" in r and "up" in r and "route1" in r]
        out: dict[str, Any] = {"requests": len(rows), "gc collections per generation": self.gc_count,
                               "gc ms per generation": [round(ms, 3) for ms in self.gc_ms],
                               "gc ms per request": round(sum(self.gc_ms) / max(1, len(self.rows)), 4),
                               "gc longest pause ms": round(self.gc_max_ms, 3), "gc thresholds": gc.get_threshold()}
        if not rows:
            return out
        for label, a, b in SPANS:
            out[label] = round(1000 * statistics.median(r[b] - r[a] for r in rows), 4)
        out["share yielding to the loop before the engine call"] = statistics.fmean(r["yielded"] for r in rows)
        return out


def instrument(stamps: Stamps) -> None:
    import fleetgate.gateway.fastpath as fastpath
    import fleetgate.gateway.flow as flow
    import fleetgate.gateway.forwarding as forwarding

    app_call = fastpath.GatewayApp.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app_call(self, scope, receive, send)
            return
        row = stamps.begin()

        async def timed_send(message: MutableMapping[str, Any]) -> None:
            first = message["type"] == "http.response.body" and message.get("body") and "first" not in row
            if first:
                row["first"] = time.perf_counter()
            await send(message)
            if first:
                row["sent"] = time.perf_counter()

        await app_call(self, scope, receive, timed_send)
        stamps.rows.append(row)

    fastpath.GatewayApp.__call__ = call  # type: ignore[method-assign]
    engine_send = forwarding.send

    async def send(*args: Any, **kwargs: Any) -> Any:
        stamps.mark("up")
        try:
            return await engine_send(*args, **kwargs)
        finally:
            stamps.mark("hdr")

    forwarding.send = send
    stamps.wrap(fastpath.CompletionRoute, "authenticate", "auth")
    stamps.wrap(flow.Flow, "admit", "admit")
    stamps.wrap(forwarding.Forwarder, "_route", "route")


def main(argv: list[str]) -> int:
    from fleetgate.bench.live_gateway import serve

    config, out = argv[0], Path(argv[1])
    stamps = Stamps()
    instrument(stamps)
    stamps.gc_timed()
    signal.signal(signal.SIGUSR1, lambda *_: out.write_text(json.dumps(stamps.summary())))
    serve(config, round_robin=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
