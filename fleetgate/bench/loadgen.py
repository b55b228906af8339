"""Load generators for the gateway benchmark: sequential latency, closed-loop throughput, streams.

All loops are bounded by a count or a duration. Latencies are wall-clock seconds per request
measured in this process (the client's cost is the same for both paths, so differences are the
gateway's). `run_wrk` drives `wrk` (a C load generator) when it is installed.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json"}


@dataclass
class Phase:
    done: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    summary: dict[float, float] = field(default_factory=dict)  # percentile -> seconds, from an external tool

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s else 0.0

    def pct(self, q: float) -> float:
        if q in self.summary:
            return self.summary[q]
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def p50(self) -> float:
        return self.pct(0.5)

    @property
    def p99(self) -> float:
        return self.pct(0.99)


async def sequential(session: aiohttp.ClientSession, url: str, body: bytes, *, count: int) -> list[float]:
    out: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        async with session.post(url + PATH, data=body, headers=HEADERS) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
        out.append(time.perf_counter() - t0)
    return out


async def streaming_ttft(session: aiohttp.ClientSession, url: str, body: bytes, *, count: int) -> list[float]:
    out: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        first = None
        async with session.post(url + PATH, data=body, headers=HEADERS) as r:
            async for line in r.content:
                if first is None and b'"content":"t' in line:
                    first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{url}: stream without content")
        out.append(first)
    return out


async def closed_loop(
    session: aiohttp.ClientSession, url: str, body: bytes, *, concurrency: int, duration_s: float
) -> Phase:
    phase = Phase()
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                async with session.post(url + PATH, data=body, headers=HEADERS) as r:
                    await r.read()
                    ok = r.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                phase.done += 1
                phase.latencies.append(time.perf_counter() - t0)
            else:
                phase.errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.elapsed_s = time.perf_counter() - start
    return phase


async def stream_throughput(
    session: aiohttp.ClientSession, url: str, body: bytes, *, concurrency: int, duration_s: float
) -> Phase:
    """`done` counts relayed content chunks."""
    phase = Phase()
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            try:
                async with session.post(url + PATH, data=body, headers=HEADERS) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            phase.done += 1
            except aiohttp.ClientError:
                phase.errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.elapsed_s = time.perf_counter() - start
    return phase


_WRK_LUA = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = [[{body}]]\n'
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def run_wrk(url: str, body: bytes, *, concurrency: int, duration_s: float) -> Phase:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_LUA.format(body=body.decode()))
        result = subprocess.run(
            ["wrk", "-t1", f"-c{concurrency}", f"-d{duration_s:g}s", "--latency", "-s", str(script), url + PATH],
            capture_output=True, text=True, timeout=duration_s + 30, check=True,
        )
    text = result.stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s)", text)
    if total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{text}")
    phase = Phase(done=int(total.group(1)), elapsed_s=float(total.group(2)) * _UNITS[total.group(3)])
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    phase.errors = (int(errors.group(1)) if errors else 0) + (
        sum(int(x) for x in socket_errors.groups()) if socket_errors else 0
    )
    for q in ("50", "99"):
        m = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", text)
        if m:
            phase.summary[int(q) / 100] = float(m.group(1)) * _UNITS[m.group(2)]
    return phase
