"""The load generator of the live benchmarks: streamed completions at set times, TTFT at the client.

`replay` sends each `LiveRequest` at its time (open loop: `at_s` from the start) or `at_s` after the
request it follows has ended (closed loop: multi-turn chat), reads the stream and records a `LiveResult`:
time to first token (the first chunk that carries a choice), chunks, the usage of the final chunk, and
the gateway's `x-fleetgate-endpoint` header. A request with `cancel_after = k` leaves after its k-th
choice chunk (the client drops the connection: a cancellation mid-stream). Requests still running at
`drain_deadline_s` are cancelled too and marked `forced`; nothing runs past it.

The parser reads only what it needs: a line is decoded with orjson only when it holds a usage. The
event loop's lag is sampled every 20 ms (`LoopLag`): a client that cannot keep up would inflate TTFT,
so its p99 is reported beside the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

COMPLETIONS = "/v1/completions"


@dataclass(frozen=True, slots=True)
class LiveRequest:
    id: str
    url: str  # base URL: the gateway, or an engine (direct)
    body: bytes
    headers: dict[str, str]
    at_s: float  # open loop: send time from the start; closed loop: think time after `after` ended
    after: str | None = None
    cancel_after: int | None = None  # leave after this many choice chunks
    tenant: str = ""
    group: str = ""
    path: str = "gateway"  # "gateway" | "direct"


@dataclass(slots=True)
class LiveResult:
    id: str
    path: str
    tenant: str
    group: str
    sent_s: float
    status: int = 0
    ttft_s: float | None = None
    done_s: float | None = None  # from the start of the replay
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cancelled: bool = False  # left on purpose (cancel_after)
    forced: bool = False  # still running at the drain deadline: cancelled then
    error: str | None = None
    endpoint: str | None = None


@dataclass(slots=True)
class LoopLag:
    """Samples how late the event loop wakes a 20 ms sleeper."""

    samples: list[float] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.02)
            self.samples.append(max(0.0, time.perf_counter() - t0 - 0.02))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def p99(self) -> float:
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def completion_body(*, model: str, prompt: str, max_tokens: int, user: str | None = None,
                    include_usage: bool = True) -> bytes:
    """A streamed `/v1/completions` body of exactly `max_tokens` output tokens (`ignore_eos`)."""
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "ignore_eos": True, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if user:
        body["user"] = user
    return orjson.dumps(body)


async def stream_one(session: aiohttp.ClientSession, req: LiveRequest, out: LiveResult, *, t0: float) -> None:
    """Send `req` and read its stream into `out` (filled as it goes, so a cancelled read keeps what it saw)."""
    start = time.perf_counter()
    try:
        async with session.post(req.url + COMPLETIONS, data=req.body, headers=req.headers) as resp:
            out.status = resp.status
            out.endpoint = resp.headers.get("x-fleetgate-endpoint")
            if resp.status != 200:
                out.error = (await resp.text())[:300]
                return
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                if b'"choices":[]' not in line:
                    out.chunks += 1
                    if out.ttft_s is None:
                        out.ttft_s = time.perf_counter() - start
                if b'"usage":{' in line:
                    usage = orjson.loads(line[6:]).get("usage") or {}
                    out.prompt_tokens = usage.get("prompt_tokens")
                    out.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    out.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
                if req.cancel_after is not None and out.chunks >= req.cancel_after:
                    out.cancelled = True
                    resp.close()  # drop the connection: the gateway (or engine) sees the client leave
                    break
    except asyncio.CancelledError:
        out.forced = True
        raise
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error = str(exc) or type(exc).__name__
    finally:
        out.done_s = time.perf_counter() - t0


async def replay(session: aiohttp.ClientSession, requests: Sequence[LiveRequest], *, drain_deadline_s: float,
                 send_until_s: float | None = None) -> tuple[list[LiveResult], float]:
    """Send `requests` (open loop and closed-loop chains) and wait for them, at most `drain_deadline_s`
    seconds from the start; closed-loop followers are not started after `send_until_s`. Returns the
    results in request order (a request never sent has none) and the start time (perf_counter)."""
    t0 = time.perf_counter()
    results: dict[str, LiveResult] = {}
    followers: dict[str, list[LiveRequest]] = {}
    for r in requests:
        if r.after is not None:
            followers.setdefault(r.after, []).append(r)
    tasks: set[asyncio.Task[None]] = set()
    stop_sending = send_until_s if send_until_s is not None else drain_deadline_s

    async def run(req: LiveRequest, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() - t0 > stop_sending:
            return
        out = results[req.id] = LiveResult(id=req.id, path=req.path, tenant=req.tenant, group=req.group,
                                           sent_s=time.perf_counter() - t0)
        await stream_one(session, req, out, t0=t0)
        for nxt in followers.get(req.id, []):
            task = asyncio.create_task(run(nxt, nxt.at_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    for req in requests:
        if req.after is None:
            task = asyncio.create_task(run(req, req.at_s - (time.perf_counter() - t0)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    while tasks:
        remaining = drain_deadline_s - (time.perf_counter() - t0)
        if remaining <= 0:
            break
        await asyncio.wait(set(tasks), timeout=remaining)
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    order = {r.id: i for i, r in enumerate(requests)}
    return sorted(results.values(), key=lambda r: order[r.id]), t0
