"""`fleetgate bench gateway`: the gateway's added latency and throughput against direct-to-engine.

Three processes: the fake engine (`fleetgate.sim.fake_engine`, answers at once), the gateway
(`fleetgate gateway`, default stages: auth/limits/accounting stubs, round-robin, cache off, one JSON
log line per request) and this process as the load generator. Each phase runs the same load
directly against the engine and through the gateway, so the ratios come from one run:

0. the same, with engine, gateway and client in this one process (no inter-process scheduling);
1. latency at concurrency 1 (non-streaming): blocks of requests alternate direct / gateway, and the
   added p50 / p99 is gateway percentile minus direct percentile;
2. throughput at `--concurrency` for `--duration` seconds each: requests per second, p99, errors,
   CPU per request of each process, and the same through a bare ASGI + aiohttp pass-through (the
   floor for any Python relay: no parsing, no stages, no metrics);
3. streaming at concurrency 1: added time to first token (first content chunk);
4. streaming throughput: relayed chunks per second at `--stream-concurrency` streams.

The load generator is Python (aiohttp), or `wrk` for phase 2 with `--loadgen wrk` when it is on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
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
    passthrough_url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by the engine and the gateway processes (user + system)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, proc in zip(("engine", "gateway", "passthrough"), self.procs, strict=True):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out


def serve_passthrough(*, port: int, engine_url: str) -> None:
    """The floor: a bare ASGI app on uvicorn relaying each POST to the engine with aiohttp (no parsing,
    no stages, no metrics, no streaming). Started in its own process by the benchmark."""
    import uvicorn

    state: dict[str, aiohttp.ClientSession] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["session"] = aiohttp.ClientSession()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await state["session"].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        async with state["session"].post(engine_url + scope["path"], data=body,
                                          headers={"Content-Type": "application/json"}) as r:
            data = await r.read()
        await send({"type": "http.response.start", "status": r.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning")


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
def running_stack(*, gateway_log: bool, minimal_stages: bool) -> Iterator[Stack]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    engine_port, gateway_port, passthrough_port = free_port(), free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    with tempfile.TemporaryDirectory(prefix="fleetgate-bench-") as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "server": {"port": gateway_port, "log_requests": gateway_log},
            "models": [{"name": MODEL, "endpoints": [engine_url]}],
        }))
        stack = Stack(engine_url=engine_url, gateway_url=f"http://127.0.0.1:{gateway_port}",
                      passthrough_url=f"http://127.0.0.1:{passthrough_port}")
        try:
            engine = subprocess.Popen(
                [sys.executable, "-m", "fleetgate.sim.fake_engine", "--port", str(engine_port), "--model", MODEL],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            stack.procs.append(engine)
            command = (["fleetgate.bench.gateway_overhead", "minimal", str(config)] if minimal_stages
                       else ["fleetgate", "gateway", "--config", str(config)])
            gateway = subprocess.Popen(
                [sys.executable, "-m", *command],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            stack.procs.append(gateway)
            passthrough = subprocess.Popen(
                [sys.executable, "-m", "fleetgate.bench.gateway_overhead", "passthrough", str(passthrough_port),
                 engine_url],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            stack.procs.append(passthrough)
            _wait_http(engine_url + "/health", timeout_s=30, proc=engine)
            _wait_http(stack.gateway_url + "/readyz", timeout_s=30, proc=gateway)
            _wait_http(stack.passthrough_url + "/", timeout_s=30, proc=passthrough)
            yield stack
        finally:
            for proc in stack.procs:
                proc.terminate()
            for proc in stack.procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()


async def _in_process(args: argparse.Namespace, body: bytes) -> dict[str, list[float]]:
    """Engine, gateway and client in this one event loop: the added latency is the gateway's own
    path length (parse, stages, upstream call, relay) with no waiting for the OS to schedule another
    process, which on a shared 2-core machine dominates the multi-process figures."""
    from fleetgate.gateway.serve import build_server
    from fleetgate.gateway.settings import GatewaySettings
    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

    engine = await FakeEngine(FakeEngineConfig(model=MODEL)).start()
    port = free_port()
    settings = GatewaySettings.model_validate({
        "server": {"port": port, "log_requests": not args.no_gateway_log, "auth": "open"},
        "models": [{"name": MODEL, "endpoints": [engine.url]}],
    })
    server = build_server(settings, metrics_port=0)
    task = asyncio.ensure_future(server.serve())
    try:
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)
        targets = {"direct": engine.url, "gateway": f"http://127.0.0.1:{port}"}
        lat: dict[str, list[float]] = {"direct": [], "gateway": []}
        async with aiohttp.ClientSession() as session:
            for url in targets.values():
                await sequential(session, url, body, count=200)
            blocks = max(1, args.requests // 250)
            for _ in range(blocks):
                for name, url in targets.items():
                    lat[name].extend(await sequential(session, url, body, count=args.requests // blocks))
        return lat
    finally:
        server.should_exit = True
        await task
        await engine.stop()


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
    rps_targets = {**targets, "passthrough": stack.passthrough_url}
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
            for name, url in rps_targets.items():
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
        for name, url in rps_targets.items():
            before = stack.cpu_s()
            out["rps"][name] = run_wrk(url, body, concurrency=args.concurrency, duration_s=args.duration)
            out[f"cpu_{name}"] = _cpu_per_request(before, stack.cpu_s(), out["rps"][name])
    return out


def _cpu_per_request(before: dict[str, float], after: dict[str, float], phase: Phase) -> dict[str, float]:
    requests = max(1.0, phase.rate * phase.elapsed_s if phase.summary else phase.done)
    return {name: (after[name] - before[name]) / requests for name in after}


def _latency_lines(lat: dict[str, list[float]]) -> None:
    d50, g50 = statistics.median(lat["direct"]), statistics.median(lat["gateway"])
    d99, g99 = _pct(lat["direct"], 0.99), _pct(lat["gateway"], 0.99)
    print(f"   direct   p50 {_ms(d50)}  p99 {_ms(d99)}")
    print(f"   gateway  p50 {_ms(g50)}  p99 {_ms(g99)}")
    print(f"   added    p50 {_ms(g50 - d50)}  p99 {_ms(g99 - d99)}   (targets: <= 1.000 / <= 3.000)")


def _report(results: dict[str, Any], args: argparse.Namespace) -> None:
    lat = results["latency"]
    load = os.getloadavg()[0]
    stages = "no-op stages" if args.minimal_stages else "configured stages"
    print(f"fleetgate bench gateway  ({stages}, {os.cpu_count()} CPUs, load average {load:.1f} at the end, "
          f"loadgen={args.loadgen}, {len(lat['direct'])} requests per path at concurrency 1, "
          f"{args.concurrency} connections x {args.duration:g}s)")
    print("\n0. non-streaming latency at concurrency 1, engine + gateway + client in one process (ms)")
    _latency_lines(results["in_process"])
    print("\n1. non-streaming latency at concurrency 1, three processes (ms)")
    _latency_lines(lat)
    ttft = results["ttft"]
    t50d, t50g = statistics.median(ttft["direct"]), statistics.median(ttft["gateway"])
    print("\n2. streaming time to first token at concurrency 1 (ms)")
    print(f"   direct p50 {_ms(t50d)}  gateway p50 {_ms(t50g)}  added p50 {_ms(t50g - t50d)}   (target <= 1.000)")
    rps = results["rps"]
    d, g = rps["direct"], rps["gateway"]
    print(f"\n3. throughput at {args.concurrency} connections (whole box: engine + gateway + load generator)")
    for name, phase in (("direct", d), ("gateway", g), ("floor", rps["passthrough"])):
        print(f"   {name:8} {phase.rate:8.0f} req/s  p50 {_ms(phase.p50)} ms  p99 {_ms(phase.p99)} ms  "
              f"errors {phase.errors}")
    print(f"   gateway/direct RPS ratio {g.rate / d.rate:.2f}   (target: gateway >= 1500 req/s, p99 < 50 ms, "
          "no errors)")
    cd, cg, cp = results["cpu_direct"], results["cpu_gateway"], results["cpu_passthrough"]
    print(f"   CPU per request: engine {cd['engine'] * 1e6:.0f} us (direct); through the gateway: engine "
          f"{cg['engine'] * 1e6:.0f} us + gateway {cg['gateway'] * 1e6:.0f} us; through the floor: engine "
          f"{cp['engine'] * 1e6:.0f} us + floor {cp['passthrough'] * 1e6:.0f} us")
    print(f"   gateway/floor CPU per request {cg['gateway'] / cp['passthrough']:.2f}  "
          "(floor: bare ASGI + aiohttp pass-through, no features)")
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
    parser.add_argument("--minimal-stages", action="store_true",
                        help="run the gateway with no-op stages (the pipeline's own cost, phases 1-4)")


def run(args: argparse.Namespace) -> int:
    if args.loadgen == "wrk" and shutil.which("wrk") is None:
        print("wrk is not on PATH (apt-get install wrk), or use --loadgen python", file=sys.stderr)
        return 2
    import uvloop

    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "say something short"}],
                         "max_tokens": 16})
    in_process = uvloop.run(_in_process(args, body))
    with running_stack(gateway_log=not args.no_gateway_log, minimal_stages=args.minimal_stages) as stack:
        results = uvloop.run(_measure(stack, args))
    results["in_process"] = in_process
    _report(results, args)
    return 0


def serve_minimal_gateway(config: str) -> None:
    """The gateway with every stage a no-op (round-robin, auth off, no limits, no accounting, no cache,
    no tiers): what the pipeline itself costs, apart from the configured stages."""
    from fleetgate.cache.types import NoCache
    from fleetgate.core.config import load_model
    from fleetgate.gateway.serve import build_server
    from fleetgate.gateway.settings import GatewaySettings
    from fleetgate.gateway.stages import NoAccounting, NoLimits, OpenAuth
    from fleetgate.router.roundrobin import RoundRobinScheduler
    from fleetgate.router.tiers.types import PassThroughTiers

    settings = load_model(GatewaySettings, config)
    build_server(settings, metrics_port=0, scheduler=RoundRobinScheduler(), auth=OpenAuth(), limiter=NoLimits(),
                 accountant=NoAccounting(), cache=NoCache(), tiers=PassThroughTiers()).run()


def main(argv: list[str]) -> int:
    """Helper servers the benchmark starts in their own processes:
    `python -m fleetgate.bench.gateway_overhead passthrough PORT ENGINE_URL` (the floor) and
    `python -m fleetgate.bench.gateway_overhead minimal CONFIG` (the gateway with no-op stages)."""
    if argv[0] == "passthrough":
        serve_passthrough(port=int(argv[1]), engine_url=argv[2])
    else:
        serve_minimal_gateway(argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
