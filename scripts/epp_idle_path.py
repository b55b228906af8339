"""Where a streamed request's extra time-to-first-token goes through Envoy + an Endpoint Picker (issue 27).

    python scripts/epp_idle_path.py [--requests 60] [--gap-ms 40] [--trace-epp] [--null aio grpclib aio-pin]
        [--envoy-variants nolua google nohc] [--baseline-python OTHER/.venv/bin/python] [--access-log]
        [--load-streams 4 --load-requests 100]

(docs/reports/epp.md, "The idle path, message by message"). One simulated vLLM CPU engine in this process; its
request arrival (body read) and its first body write are time-stamped. Every door is its own process, as deployed:
Envoy alone; Envoy + `fleetgate epp` run by this interpreter ("epp"; `--trace-epp`: time-stamped, see
`fleetgate.bench.null_picker`); with `--baseline-python` Envoy + the picker of another checkout ("epp before");
with `--null` Envoy + a null picker per named transport (`fleetgate.bench.null_picker`: the protocol's own cost);
with `--envoy-variants` Envoy + the grpc.aio null picker, Envoy's bootstrap changed one way (`nolua`: without the
guard filter; `google`: `google_grpc` in place of `envoy_grpc`; `nohc`: no health check on the picker's cluster).

Idle phase: one request through each door in turn, a `--gap-ms` pause before each (nothing else runs), the door
order rotating. All clocks are one (`time.perf_counter` is CLOCK_MONOTONIC in every process), so per door it prints
the TTFT p50 and, over Envoy alone's, the door's own time p50 (request path + return path: the engine's own time
left out, so the engine's noise is too), the request path (client send -> the engine has the body) and the return
path (the engine's first write -> the client has it); for the time-stamped pickers, each step on the first token's
path (p50, ms). `--access-log`: Envoy's own timings per door (p50, µs: its stream milestones from the first byte
received, and the ext_proc filter's per-message latencies). `--load-streams N`: then a loaded phase per door
(N concurrent streams, one short probe at a time meanwhile): probe TTFT p50 over Envoy alone's and CPU per request
of the picker and its Envoy. Bounded: every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

try:
    import fleetgate  # noqa: F401
except ImportError:  # the GPU machine: not installed; the import tree `scripts/gpu_routing_run.py` assembles
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from static_checks import assemble

    _tree = str(assemble())
    sys.path.insert(0, _tree)
    os.environ["PYTHONPATH"] = os.pathsep.join([_tree, *filter(None, [os.environ.get("PYTHONPATH")])])  # the pickers

from fleetgate.bench.null_picker import AIO_VARIANTS, SEQ

ALONE = "envoy alone"
PROMPT = "shared system prompt words " * 200  # ~1,000 tokens, the same prefix every time: prefix hits
ENVOY_VARIANTS = ("nolua", "google", "nohc")
Stamps = dict[str, dict[str, float]]  # per request (its x-bench-seq): named perf_counter times
STEPS = (("sent", "open"), ("open", "req_headers"), ("req_headers", "req_body"), ("req_body", "req_body_decided"),
         ("req_body", "req_body_w1"), ("req_body_w1", "req_body_w2"), ("req_body_w2", "engine_rx"),
         ("engine_first", "chunk1"), ("chunk1", "chunk1_decided"), ("chunk1", "chunk1_w1"), ("chunk1_w1", "first"))
ACCESS_FIELDS = {
    "seq": f"%REQ({SEQ})%",
    **{f"{point.lower()}_us": f"%COMMON_DURATION(DS_RX_BEG:{point}:us)%"
       for point in ("DS_RX_END", "US_TX_BEG", "US_RX_BEG", "DS_TX_BEG")},
    **{f: f"%FILTER_STATE(envoy.filters.http.ext_proc:FIELD:{f})%" for f in (
        "request_header_latency_us", "request_body_total_latency_us", "response_header_latency_us",
        "response_body_call_count", "response_body_total_latency_us")},
}


def _engine_app(engine: Any, stamps: Stamps) -> Any:
    """The simulated engine's app: the time its request body is in and the time of its first body write."""
    from aiohttp import web

    from fleetgate.sim.server import build_app

    app = build_app(engine)

    @web.middleware
    async def stamp(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        seq = request.headers.get(SEQ)
        if seq is not None:
            await request.read()
            stamps.setdefault(seq, {})["engine_rx"] = time.perf_counter()
        return await handler(request)

    async def first_write(request: web.Request, response: web.StreamResponse) -> None:
        seq = request.headers.get(SEQ)
        if seq is None:
            return
        write = response.write

        async def stamped(data: bytes) -> None:
            stamps[seq].setdefault("engine_first", time.perf_counter())
            await write(data)

        response.write = stamped  # type: ignore[method-assign]

    app.middlewares.append(stamp)
    app.on_response_prepare.append(first_write)
    return app


async def _one(session: aiohttp.ClientSession, url: str, model: str, seq: str, key: str, stamps: Stamps) -> None:
    """One streamed completion (4 tokens): its send and first-chunk times in `stamps[seq]`."""
    body = {"model": model, "prompt": f"{PROMPT} {seq}", "max_tokens": 4, "temperature": 0, "stream": True}
    row = stamps.setdefault(seq, {})
    row["sent"] = time.perf_counter()
    async with session.post(f"{url}/v1/completions", data=orjson.dumps(body), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {key}", SEQ: seq}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {(await resp.read())[:300]!r}")
        async for raw in resp.content:
            if "first" not in row and raw.startswith(b"data: {"):
                row["first"] = time.perf_counter()
    if "first" not in row:
        raise RuntimeError(f"{url} answered without a first token")


async def _ready(session: aiohttp.ClientSession, url: str, model: str, key: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await _one(session, url, model, "ready", key, {})
            return
        except (aiohttp.ClientError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def _null_doors(args: argparse.Namespace) -> list[str]:
    return [f"null {k}" for k in args.null] + [f"null aio+{v}" for v in args.envoy_variants]


def _file(door: str) -> str:
    return door.replace(" ", "_").replace("+", "_")


def _picker_argvs(args: argparse.Namespace, tmp: Path, ports: dict[str, int], dest: str,
                  settings: dict[str, Any]) -> dict[str, list[str]]:
    """Each picker door's process: `fleetgate epp` (time-stamped with `--trace-epp`), or a null picker."""
    argvs: dict[str, list[str]] = {}
    pythons = {"epp": sys.executable, **({"epp before": args.baseline_python} if args.baseline_python else {}),
               **({"epp pinned": sys.executable} if args.epp_pinned else {})}
    for name, python in pythons.items():
        config = tmp / f"{_file(name)}.yaml"
        config.write_text(yaml.safe_dump({**settings, "epp": {"host": "127.0.0.1", "port": ports[name]}}))
        traced = args.trace_epp and name == "epp"
        argvs[name] = ([python, "-m", "fleetgate.bench.null_picker", "epp", str(config), str(tmp / _file(name))]
                       if traced else [python, "-m", "fleetgate", "epp", "--config", str(config)])
    for door in _null_doors(args):
        kind = door.split()[1].partition("+")[0]
        argvs[door] = [sys.executable, "-m", "fleetgate.bench.null_picker", kind, str(ports[door]), dest,
                       str(tmp / _file(door))]
    return argvs


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def envoy_variant(config: dict[str, Any], name: str, epp: tuple[str, int]) -> dict[str, Any]:
    """The picker's Envoy bootstrap changed one way (`ENVOY_VARIANTS`; "" leaves it as it is)."""
    hcm = _hcm(config)
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]
    epp_cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "epp")
    if name == "nolua":
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "fleetgate.guard"]
    elif name == "google":
        ext_proc["grpc_service"] = {"google_grpc": {"target_uri": f"{epp[0]}:{epp[1]}", "stat_prefix": "epp"},
                                    "timeout": ext_proc["grpc_service"]["timeout"]}
    elif name == "nohc":
        epp_cluster.pop("health_checks", None)
        epp_cluster.pop("common_lb_config", None)
    elif name:
        raise ValueError(f"unknown Envoy variant {name!r}: one of {ENVOY_VARIANTS}")
    return config


def with_access_log(config: dict[str, Any], path: Path) -> dict[str, Any]:
    _hcm(config)["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog", "path": str(path),
        "log_format": {"json_format": ACCESS_FIELDS}}}]
    return config


def _p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def report_idle(rows: dict[str, list[dict[str, float]]], traces: dict[str, Stamps]) -> list[str]:
    """The idle phase's table (module docstring) and, per time-stamped picker, its steps."""
    def span(row: dict[str, float], a: str, b: str) -> float:
        return row[b] - row[a]

    parts: dict[str, Callable[[dict[str, float]], float]] = {
        "ttft": lambda r: span(r, "sent", "first"),
        "door": lambda r: span(r, "sent", "engine_rx") + span(r, "engine_first", "first"),
        "request": lambda r: span(r, "sent", "engine_rx"),
        "return": lambda r: span(r, "engine_first", "first"),
    }
    base = {k: _p50_ms([f(r) for r in rows[ALONE]]) for k, f in parts.items()}
    lines = [f"{'door':<20} {'TTFT p50':>8}  {'over':>6} | {'door time':>9} {'over':>6} | {'request':>7} {'over':>6} "
             f"| {'return':>6} {'over':>6} | n"]
    for door, door_rows in rows.items():
        p50 = {k: _p50_ms([f(r) for r in door_rows]) for k, f in parts.items()}
        over = {k: p50[k] - base[k] for k in parts}
        lines.append(f"{door:<20} {p50['ttft']:8.2f}  {over['ttft']:+6.2f} | {p50['door']:9.2f} {over['door']:+6.2f} | "
                     f"{p50['request']:7.2f} {over['request']:+6.2f} | {p50['return']:6.2f} {over['return']:+6.2f} | "
                     f"{len(door_rows)}")
    for door, trace in traces.items():
        merged = [{**r, **trace[seq]} for seq, r in ((_seq(door, i), r) for i, r in enumerate(rows[door]))
                  if seq in trace]
        if merged:
            lines.append(f"{door}: p50 ms of each step on the first token's path ({len(merged)} requests)")
            lines.append("  " + "  ".join(f"{a}->{b} {_p50_ms([m[b] - m[a] for m in merged]):.3f}"
                                          for a, b in STEPS if all(a in m and b in m for m in merged)))
    return lines


def _seq(door: str, i: int) -> str:
    return f"{_file(door)}-{i}"


def report_access(logs: dict[str, Path]) -> list[str]:
    """Envoy's own timings per door, p50 in µs (fields it did not log are left out)."""
    lines = ["Envoy's own timings (p50, µs; stream milestones from the first byte received, ext_proc latencies):"]
    for door, path in logs.items():
        entries = [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []
        entries = [e for e in entries if e.get("seq") and e["seq"] != "ready" and not e["seq"].startswith("load")]
        fields = {k: statistics.median(float(e[k]) for e in entries if e.get(k) not in (None, "-", ""))
                  for k in ACCESS_FIELDS if k != "seq" and any(e.get(k) not in (None, "-", "") for e in entries)}
        lines.append(f"  {door:<20} " + "  ".join(f"{k} {v:.0f}" for k, v in fields.items()))
    return lines


async def _idle(args: argparse.Namespace, session: aiohttp.ClientSession, urls: dict[str, str], model: str,
                key: str, stamps: Stamps) -> dict[str, list[dict[str, float]]]:
    rows: dict[str, list[dict[str, float]]] = {door: [] for door in urls}
    doors = list(urls)
    for i in range(args.requests + args.warmup):
        shift = i % len(doors)
        for door in doors[shift:] + doors[:shift]:
            await asyncio.sleep(args.gap_ms / 1e3)
            seq = _seq(door, i - args.warmup) if i >= args.warmup else f"warm-{_file(door)}-{i}"
            await _one(session, urls[door], model, seq, key, stamps)
            if i >= args.warmup:
                rows[door].append(stamps[seq])
    return rows


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _loaded(args: argparse.Namespace, session: aiohttp.ClientSession, urls: dict[str, str],
                  pids: dict[str, int], envoys: dict[str, Any], model: str, key: str, stamps: Stamps) -> list[str]:
    """Each door in turn under `--load-streams` concurrent streams, one short probe at a time meanwhile."""
    probes: dict[str, list[float]] = {door: [] for door in urls}
    cpu: dict[str, list[float]] = {door: [0.0, 0.0] for door in urls}  # the picker's and its Envoy's CPU s
    for r in range(args.load_rounds):
        for door in list(urls) if r % 2 == 0 else list(reversed(urls)):
            queue = list(range(args.load_requests))

            async def worker(door: str = door, queue: list[int] = queue, r: int = r) -> None:
                while queue:
                    body = {"model": model, "prompt": f"load {r} {queue.pop()} " + "word " * 60, "stream": True,
                            "max_tokens": args.load_tokens, "stream_options": {"include_usage": True}}
                    async with session.post(f"{urls[door]}/v1/completions", data=orjson.dumps(body), headers={
                            "Content-Type": "application/json", "Authorization": f"Bearer {key}"}) as resp:
                        await resp.read()

            async def probe(door: str = door, queue: list[int] = queue, r: int = r) -> None:
                n = 0
                while queue:
                    n += 1
                    seq = f"load-{_file(door)}-{r}-{n}"
                    await _one(session, urls[door], model, seq, key, stamps)
                    probes[door].append(stamps[seq]["first"] - stamps[seq]["sent"])

            pid = pids.get(door)
            p0, e0 = _cpu_s(pid) if pid else 0.0, envoys[door].cpu_s()
            await asyncio.gather(probe(), *(worker() for _ in range(args.load_streams)))
            cpu[door][0] += (_cpu_s(pid) if pid else 0.0) - p0
            cpu[door][1] += envoys[door].cpu_s() - e0
    n = args.load_requests * args.load_rounds
    base = _p50_ms(probes[ALONE])
    lines = [f"loaded: {args.load_streams} streams, {args.load_requests} requests of {args.load_tokens} tokens per "
             f"door and round, {args.load_rounds} rounds; load average {os.getloadavg()[0]:.2f}"]
    for door, values in probes.items():
        lines.append(f"  {door:<20} probe TTFT p50 {_p50_ms(values):8.2f} ms, over Envoy alone "
                     f"{_p50_ms(values) - base:+6.2f} ({len(values)} probes); CPU ms/request: picker "
                     f"{cpu[door][0] / n * 1e3:.2f}, its Envoy {cpu[door][1] / n * 1e3:.2f}")
    return lines


def _pin() -> None:
    """The "epp pinned" door: the picker's process (so every thread it starts) on one CPU, the last one."""
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def _start(argvs: dict[str, list[str]]) -> dict[str, subprocess.Popen[bytes]]:
    return {name: subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONSAFEPATH": "1"},
                                   preexec_fn=_pin if name == "epp pinned" else None)
            for name, argv in argvs.items()}


def _read_traces(tmp: Path, doors: list[str]) -> dict[str, Stamps]:
    traces: dict[str, Stamps] = {}
    for door in doors:
        path = tmp / _file(door)
        lines = path.read_bytes().splitlines() if path.exists() else []
        traces[door] = {row["seq"]: row for row in map(orjson.loads, lines)}
    return traces


async def measure(args: argparse.Namespace) -> list[str]:
    from aiohttp import web

    from fleetgate.bench.envoy import EnvoyProcess
    from fleetgate.bench.envoy_phase import plain_proxy_config
    from fleetgate.bench.gateway_stack import terminate
    from fleetgate.core.localredis import free_port
    from fleetgate.gateway.epp.envoyconfig import envoy_config
    from fleetgate.gateway.tenancy.keys import new_key
    from fleetgate.sim.engine import SimEngine
    from fleetgate.sim.profile import get_profile

    key, key_hash = new_key()
    profile = get_profile("vllm-cpu-gemma3-270m").with_(time_scale=args.time_scale)
    stamps: Stamps = {}
    runner = web.AppRunner(_engine_app(SimEngine(profile=profile, name="sim-0"), stamps), access_log=None,
                           handle_signals=False)
    await runner.setup()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    envoys: dict[str, EnvoyProcess] = {}
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        engine = ("127.0.0.1", int(runner.addresses[0][1]))
        url = f"http://{engine[0]}:{engine[1]}"
        settings = {"server": {"auth": "api_key", "metrics_port": None, "log_requests": False},
                    "models": [{"name": profile.model, "endpoints": [url]}],
                    "tenancy": {"tenants": [{"id": "bench", "key_hashes": [key_hash]}]}, "cache": {"enabled": False}}
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            pickers = ["epp", *(["epp before"] if args.baseline_python else []),
                       *(["epp pinned"] if args.epp_pinned else []), *_null_doors(args)]
            ports = {name: free_port() for name in pickers}
            argvs = _picker_argvs(args, tmp, ports, f"{engine[0]}:{engine[1]}", settings)
            procs.update(await asyncio.to_thread(_start, argvs))
            listen = {door: free_port() for door in [ALONE, *pickers]}
            configs = {ALONE: plain_proxy_config(listen=listen[ALONE], upstream=engine)}
            for name in pickers:
                epp = ("127.0.0.1", ports[name])
                configs[name] = envoy_variant(envoy_config(listen=("127.0.0.1", listen[name]), epp=epp, pool=[engine],
                                                           health_interval_s=0.2), name.partition("+")[2], epp)
            logs = {door: tmp / f"access_{_file(door)}.log" for door in configs} if args.access_log else {}
            for door, config in configs.items():
                envoys[door] = EnvoyProcess(with_access_log(config, logs[door]) if logs else config)
                await asyncio.to_thread(envoys[door].__enter__)
            urls = {door: f"http://127.0.0.1:{listen[door]}" for door in configs}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                for door_url in urls.values():
                    await _ready(session, door_url, profile.model, key)
                rows = await _idle(args, session, urls, profile.model, key, stamps)
                idle_load = os.getloadavg()[0]
                loaded = (await _loaded(args, session, urls, {d: p.pid for d, p in procs.items()}, envoys,
                                        profile.model, key, stamps) if args.load_streams else [])
            await asyncio.sleep(0.3)  # the pickers' last trace lines
            traced = _null_doors(args) + (["epp"] if args.trace_epp else [])
            lines = [f"idle: streamed /v1/completions (4 tokens, ~1,000-token prefix-hit prompt), one at a time, "
                     f"{args.gap_ms:g} ms apart, {args.requests} per door; engine time scale {args.time_scale}; "
                     f"load average {idle_load:.2f}", *report_idle(rows, _read_traces(tmp, traced))]
            if logs:
                for envoy in envoys.values():  # Envoy flushes its access log once a second, and when it stops
                    await asyncio.to_thread(envoy.stop)
                lines += report_access(logs)
            return lines + loaded
    finally:
        for envoy in envoys.values():
            await asyncio.to_thread(envoy.__exit__, None, None, None)
        for proc in procs.values():  # SIGTERM: the picker drains (nothing is in flight), the null pickers just end
            await asyncio.to_thread(terminate, proc)
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=60, help="measured idle requests per door")
    parser.add_argument("--warmup", type=int, default=3, help="idle requests per door before the measured ones")
    parser.add_argument("--gap-ms", type=float, default=40.0, help="idle pause before each request")
    parser.add_argument("--time-scale", type=float, default=0.1, help="the simulated engine's time scale")
    parser.add_argument("--trace-epp", action="store_true", help="time-stamp the picker's messages too")
    parser.add_argument("--baseline-python", help="also Envoy + the picker run by this interpreter ('epp before')")
    parser.add_argument("--epp-pinned", action="store_true",
                        help="also Envoy + the picker with its process on one CPU ('epp pinned')")
    parser.add_argument("--null", nargs="*", default=[], choices=[*AIO_VARIANTS, "sync", "grpclib"],
                        help="also Envoy + a null picker on each of these transports")
    parser.add_argument("--envoy-variants", nargs="*", default=[], choices=ENVOY_VARIANTS,
                        help="also Envoy + the grpc.aio null picker, Envoy's bootstrap changed this way")
    parser.add_argument("--access-log", action="store_true", help="print Envoy's own timings per door")
    parser.add_argument("--load-streams", type=int, default=0, help="then a loaded phase with this many streams")
    parser.add_argument("--load-requests", type=int, default=100, help="streamed requests per door and loaded round")
    parser.add_argument("--load-tokens", type=int, default=32)
    parser.add_argument("--load-rounds", type=int, default=2)
    args = parser.parse_args()
    import uvloop

    print("\n".join(uvloop.run(measure(args))))


if __name__ == "__main__":
    main()
