"""Load generators for the gateway benchmark: sequential latency, closed-loop throughput, streams.

All loops are bounded by a count or a duration. Latencies are wall-clock seconds per request
measured in this process (the client's cost is the same for both paths, so differences are the
gateway's). `run_wrk` drives `wrk` (a C load generator) when it is installed.

A request body may hold the marker `__N__`: each request replaces it by a fresh number, so every request
is a distinct prompt (cache misses); or `__V__`, replaced by a distinct question composed from word lists
(`varied_prompt`: "How do I merge JSON records in Go without a library?"), so that consecutive prompts are
near one another in other words, not in a number (what a semantic cache's misses look like in real
traffic); a body without a marker repeats verbatim. `headers` go with every request
(the benchmark tenant's API key; engines ignore it).
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
UNIQUE = b"__N__"
VARIED = b"__V__"
# `varied_prompt`'s parts: 20 x 20 x 16 x 12 = 76,800 distinct questions
_VERBS = ("sort", "reverse", "merge", "filter", "serialize", "deduplicate", "paginate", "validate", "compress",
          "encrypt", "cache", "parse", "stream", "batch", "retry", "schedule", "index", "group", "diff", "export")
_OBJECTS = ("a list", "a dictionary", "a CSV file", "JSON records", "log lines", "user sessions", "HTTP requests",
            "database rows", "image files", "timestamps", "nested arrays", "email addresses", "a linked list",
            "config files", "API responses", "large strings", "a binary tree", "sensor readings", "invoices",
            "chat messages")
_CONTEXTS = ("in Python", "in Go", "in Rust", "with pandas", "in JavaScript", "in SQL", "on Kubernetes",
             "with Redis", "in Java", "in a shell script", "in C#", "with numpy", "in TypeScript", "in Kotlin",
             "with PostgreSQL", "in Ruby")
_CONSTRAINTS = ("without a library", "without extra memory", "as fast as possible", "safely", "in one pass",
                "for a beginner", "with tests", "in parallel", "lazily", "without copying", "step by step",
                "in production")


def varied_prompt(n: int) -> str:
    """The `n`-th question of the varied workload (distinct for n below 76,800, then it cycles)."""
    parts = []
    for words in (_VERBS, _OBJECTS, _CONTEXTS, _CONSTRAINTS):
        parts.append(words[n % len(words)])
        n //= len(words)
    verb, obj, context, constraint = parts
    return f"How do I {verb} {obj} {context} {constraint}?"


class Bodies:
    """The request bodies of a run: `template` as is, or with `__N__` replaced by a counter per request
    (`__V__`: by `varied_prompt` of it)."""

    def __init__(self, template: bytes, *, start: int = 0) -> None:
        self.template = template
        self.unique = UNIQUE in template or VARIED in template
        self._n = start

    def next(self) -> bytes:
        if not self.unique:
            return self.template
        self._n += 1
        return (self.template.replace(UNIQUE, str(self._n).encode())
                .replace(VARIED, varied_prompt(self._n).encode()))


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


async def sequential(
    session: aiohttp.ClientSession, url: str, body: bytes | Bodies, *, count: int, headers: dict[str, str] = HEADERS
) -> list[float]:
    bodies = body if isinstance(body, Bodies) else Bodies(body)
    out: list[float] = []
    for _ in range(count):
        data = bodies.next()
        t0 = time.perf_counter()
        async with session.post(url + PATH, data=data, headers=headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
        out.append(time.perf_counter() - t0)
    return out


async def streaming_ttft(
    session: aiohttp.ClientSession, url: str, body: bytes, *, count: int, headers: dict[str, str] = HEADERS
) -> list[float]:
    out: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        first = None
        async with session.post(url + PATH, data=body, headers=headers) as r:
            async for line in r.content:
                if first is None and b'"content":"t' in line:
                    first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{url}: stream without content")
        out.append(first)
    return out


async def closed_loop(
    session: aiohttp.ClientSession, url: str, body: bytes | Bodies, *, concurrency: int, duration_s: float,
    headers: dict[str, str] = HEADERS,
) -> Phase:
    bodies = body if isinstance(body, Bodies) else Bodies(body)
    phase = Phase()
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            data = bodies.next()
            t0 = time.perf_counter()
            try:
                async with session.post(url + PATH, data=data, headers=headers) as r:
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
    session: aiohttp.ClientSession, url: str, body: bytes, *, concurrency: int, duration_s: float,
    headers: dict[str, str] = HEADERS,
) -> Phase:
    """`done` counts relayed content chunks."""
    phase = Phase()
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            try:
                async with session.post(url + PATH, data=body, headers=headers) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            phase.done += 1
            except aiohttp.ClientError:
                phase.errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.elapsed_s = time.perf_counter() - start
    return phase


_WRK_LUA = 'wrk.method = "POST"\n{headers}wrk.body = [[{body}]]\n'
# A distinct body per request: wrk calls `request()` for each one (one wrk thread, so `n` is unique).
_WRK_UNIQUE = ('n = 0\nrequest = function()\n  n = n + 1\n'
               '  return wrk.format(nil, nil, nil, (wrk.body:gsub("__N__", n)))\nend\n')


def _lua_list(words: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{w}"' for w in words) + "}"


# the same questions as `varied_prompt`, from a counter that starts at `start` (wrk runs one thread)
_WRK_VARIED = ("n = {start}\nparts = {{{lists}}}\n"
               "request = function()\n  n = n + 1\n  local m, out = n, {{}}\n"
               "  for i = 1, 4 do\n    local words = parts[i]\n    out[i] = words[(m % #words) + 1]\n"
               "    m = math.floor(m / #words)\n  end\n"
               '  local q = "How do I " .. out[1] .. " " .. out[2] .. " " .. out[3] .. " " .. out[4] .. "?"\n'
               '  return wrk.format(nil, nil, nil, (wrk.body:gsub("__V__", q)))\nend\n')
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk_script(body: bytes, *, headers: dict[str, str] = HEADERS, start: int = 0) -> str:
    """The Lua script that makes wrk send `body` (its `__N__` or `__V__` marker filled per request)."""
    lines = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    script = _WRK_LUA.format(headers=lines, body=body.decode())
    if VARIED in body:
        lists = ", ".join(map(_lua_list, (_VERBS, _OBJECTS, _CONTEXTS, _CONSTRAINTS)))
        return script + _WRK_VARIED.format(start=start, lists=lists)
    return script + (_WRK_UNIQUE if UNIQUE in body else "")


def run_wrk(
    url: str, body: bytes, *, concurrency: int, duration_s: float, headers: dict[str, str] = HEADERS,
    cpus: set[int] | None = None, start: int = 0,
) -> Phase:
    """wrk with one thread; `cpus`: the CPUs it may run on (keeps it off the gateway's core); `start`: where
    the counter of a `__V__` body starts (prompts already sent are not sent again)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(body, headers=headers, start=start))
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        result = subprocess.run(
            # --timeout: wrk's default 2 s would count a slow configuration's queueing as socket errors
            [*pin, "wrk", "-t1", f"-c{concurrency}", f"-d{duration_s:g}s", "--timeout", "10s", "--latency", "-s",
             str(script), url + PATH],
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
