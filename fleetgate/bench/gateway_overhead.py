"""`fleetgate bench gateway`: the gateway's added latency and throughput against direct-to-engine.

Three processes: the fake engine (`fleetgate.sim.fake_engine`, answers at once), the gateway
(`fleetgate gateway`, default stages: auth/limits/accounting stubs, round-robin, cache off, one JSON
log line per request) and this process as the load generator. Each phase runs the same load
directly against the engine and through the gateway, so the ratios come from one run:

1. latency at concurrency 1 (non-streaming): blocks of requests alternate direct / gateway, and the
   added p50 / p99 is gateway percentile minus direct percentile;
2. throughput at `--concurrency` for `--duration` seconds each: requests per second, p99, errors;
3. streaming at concurrency 1: added time to first token (first content chunk);
4. streaming throughput: relayed chunks per second at `--stream-concurrency` streams.

The load generator is Python (aiohttp), or `wrk` for phase 2 with `--loadgen wrk` when it is on PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from fleetgate.bench.loadgen import Phase, closed_loop, run_wrk, sequential, stream_throughput, streaming_ttft
from fleetgate.core.localredis import free_port

MODEL = "bench"


@dataclass
class Stack:
    engine_url: str
    gateway_url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by the engine and the gateway processes (user + system)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, proc in zip(("engine", "gateway"), self.procs, strict=True):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out


def _wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


@contextmanager
def running_stack(*, gateway_log: bool) -> Iterator[Stack]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    with tempfile.TemporaryDirectory(prefix="fleetgate-bench-") as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "server": {"port": gateway_port, "log_requests": gateway_log},
            "models": [{"name": MODEL, "endpoints": [engine_url]}],
        }))
        stack = Stack(engine_url=engine_url, gateway_url=f"http://127.0.0.1:{gateway_port}")
        try:
            engine = subprocess.Popen(
                [sys.executable, "-m", "fleetgate.sim.fake_engine", "--port", str(engine_port), "--model", MODEL],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            stack.procs.append(engine)
            gateway = subprocess.Popen(
                [sys.executable, "-m", "fleetgate", "gateway", "--config", str(config)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            stack.procs.append(gateway)
            _wait_http(engine_url + "/health", timeout_s=30, proc=engine)
            _wait_http(stack.gateway_url + "/readyz", timeout_s=30, proc=gateway)
            yield stack
        finally:
            for proc in stack.procs:
                proc.terminate()
            for proc in stack.procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


async def _measure(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "say something short"}], "max_tokens": 16}
    body = orjson.dumps(chat)
    stream_body = orjson.dumps({**chat, "stream": True})
    targets = {"direct": stack.engine_url, "gateway": stack.gateway_url}
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # warm-up both paths (connection pools, code paths)
        for url in targets.values():
            await sequential(session, url, body, count=200)
        # 1. latency at concurrency 1, alternating blocks
        lat: dict[str, list[float]] = {"direct": [], "gateway": []}
        blocks = max(1, args.requests // 250)
        for _ in range(blocks):
            for name, url in targets.items():
                lat[name].extend(await sequential(session, url, body, count=args.requests // blocks))
        out["latency"] = lat
        # 3. streaming time to first token, alternating blocks
        ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
        for _ in range(max(1, args.stream_requests // 100)):
            for name, url in targets.items():
                ttft[name].extend(await streaming_ttft(session, url, stream_body, count=100))
        out["ttft"] = ttft
        # 2. throughput
        if args.loadgen == "python":
            phases: dict[str, Phase] = {}
            for name, url in targets.items():
                before = stack.cpu_s()
                phases[name] = await closed_loop(session, url, body, concurrency=args.concurrency,
                                                 duration_s=args.duration)
                out[f"cpu_{name}"] = _cpu_per_request(before, stack.cpu_s(), phases[name])
            out["rps"] = phases
        # 4. streaming throughput
        chunks: dict[str, Phase] = {}
        for name, url in targets.items():
            chunks[name] = await stream_throughput(session, url, stream_body, concurrency=args.stream_concurrency,
                                                   duration_s=args.duration)
        out["chunks"] = chunks
    if args.loadgen == "wrk":
        out["rps"] = {}
        for name, url in targets.items():
            before = stack.cpu_s()
            out["rps"][name] = run_wrk(url, body, concurrency=args.concurrency, duration_s=args.duration)
            out[f"cpu_{name}"] = _cpu_per_request(before, stack.cpu_s(), out["rps"][name])
    return out


def _cpu_per_request(before: dict[str, float], after: dict[str, float], phase: Phase) -> dict[str, float]:
    requests = max(1.0, phase.rate * phase.elapsed_s if phase.summary else phase.done)
    return {name: (after[name] - before[name]) / requests for name in after}


def _report(results: dict[str, Any], args: argparse.Namespace) -> None:
    lat = results["latency"]
    d50, g50 = statistics.median(lat["direct"]), statistics.median(lat["gateway"])
    d99, g99 = _pct(lat["direct"], 0.99), _pct(lat["gateway"], 0.99)
    print(f"fleetgate bench gateway  ({os.cpu_count()} CPUs, loadgen={args.loadgen}, {len(lat['direct'])} requests "
          f"per path at concurrency 1, {args.concurrency} connections x {args.duration:g}s)")
    print("\n1. non-streaming latency at concurrency 1 (ms)")
    print(f"   direct   p50 {_ms(d50)}  p99 {_ms(d99)}")
    print(f"   gateway  p50 {_ms(g50)}  p99 {_ms(g99)}")
    print(f"   added    p50 {_ms(g50 - d50)}  p99 {_ms(g99 - d99)}   (targets: <= 1.000 / <= 3.000)")
    ttft = results["ttft"]
    t50d, t50g = statistics.median(ttft["direct"]), statistics.median(ttft["gateway"])
    print("\n2. streaming time to first token at concurrency 1 (ms)")
    print(f"   direct p50 {_ms(t50d)}  gateway p50 {_ms(t50g)}  added p50 {_ms(t50g - t50d)}   (target <= 1.000)")
    rps = results["rps"]
    d, g = rps["direct"], rps["gateway"]
    print(f"\n3. throughput at {args.concurrency} connections (whole box: engine + gateway + load generator)")
    for name, phase in (("direct", d), ("gateway", g)):
        print(f"   {name:8} {phase.rate:8.0f} req/s  p50 {_ms(phase.p50)} ms  p99 {_ms(phase.p99)} ms  "
              f"errors {phase.errors}")
    print(f"   gateway/direct RPS ratio {g.rate / d.rate:.2f}   (target: gateway >= 1500 req/s, p99 < 50 ms, "
          "no errors)")
    cd, cg = results["cpu_direct"], results["cpu_gateway"]
    print(f"   CPU per request: engine {cd['engine'] * 1e6:.0f} us (direct), engine {cg['engine'] * 1e6:.0f} us + "
          f"gateway {cg['gateway'] * 1e6:.0f} us (through the gateway)")
    c = results["chunks"]
    print(f"\n4. streaming at {args.stream_concurrency} concurrent streams (16 chunks each)")
    for name in ("direct", "gateway"):
        print(f"   {name:8} {c[name].rate:8.0f} chunks/s  errors {c[name].errors}")
    print(f"   gateway/direct chunk-rate ratio {c['gateway'].rate / c['direct'].rate:.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000, help="non-streaming requests per path at concurrency 1")
    parser.add_argument("--stream-requests", type=int, default=400, help="streams per path for time to first token")
    parser.add_argument("--concurrency", type=int, default=32, help="connections for the throughput phase")
    parser.add_argument("--stream-concurrency", type=int, default=64, help="concurrent streams, chunk-rate phase")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per path for each throughput phase")
    parser.add_argument("--loadgen", choices=["python", "wrk"], default="wrk" if shutil.which("wrk") else "python",
                        help="throughput load generator (default: wrk when it is on PATH)")
    parser.add_argument("--no-gateway-log", action="store_true", help="turn the per-request log line off")


def run(args: argparse.Namespace) -> int:
    if args.loadgen == "wrk" and shutil.which("wrk") is None:
        print("wrk is not on PATH (apt-get install wrk), or use --loadgen python", file=sys.stderr)
        return 2
    with running_stack(gateway_log=not args.no_gateway_log) as stack:
        import uvloop

        results = uvloop.run(_measure(stack, args))
    _report(results, args)
    return 0
