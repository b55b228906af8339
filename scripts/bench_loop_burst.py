"""One gateway process's event loop under a burst of streams (issue 24, run 8c: 128 closed-loop streams opened
within half a second stalled one gateway's loop for up to 56 ms).

Two fake engines (`fleetgate.sim.fake_engine`, one process, tokens on a shared step clock like a GPU engine's
batched decode) behind one gateway process (`fleetgate.bench.live_gateway`'s settings: API keys, in-memory
tenancy, the `default` routing preset, two engines plus `probe-<i>` models). `--streams` closed-loop streams start
at once (as the live harness's reference background does), each request a unique prompt of `--prompt-words`
words and `--tokens` output tokens, so they come back in waves; meanwhile paired probes (one request through the
gateway to engine i's `probe-i` model and its twin straight to engine i, sent together) measure the added time to
first token. The gateway child watches its loop (`fleetgate.bench.loop_watch.LoopWatch`, a timer every ms) and,
with `--stacks`, a thread samples the loop thread's Python stack whenever the loop has not run the timer for
`--stall-ms`: what the loop was doing while it stalled.

The fake engines' `/metrics` is padded to a vLLM server's size (`--metrics-families`): the gateway's router
scrapes and parses it on the loop every 0.5 s per engine. Variants (`--variants`), each a fresh gateway process
per round, rounds alternating their order: `before` (the scrape's parse as before
`router.vllm_metrics.KEPT_PREFIXES`; the baseline), `after` (the gateway as it is), `ramp` (as it is, the streams
started evenly over `--ramp-s` instead of at once as the live harness's reference background does). The report
prints each variant's loop lag p99/max, its stalls (gaps of >= `--stall-ms` between timer runs: how many a second,
and the share of their time the loop's thread was on a CPU; low: the box's other processes, not the gateway's
work), the probes' added TTFT and the gateway's CPU per request, and their ratios to the first variant, all from
the same run. `--gateway-cpu 0` pins the gateway alone on CPU 0 (engines and load generator on the others).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_loop_burst.py --streams 128 --rounds 3 --gateway-cpu 0
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

WORDS = ["the", "gateway", "relays", "every", "token", "an", "engine", "streams", "while", "the", "fleet", "serves",
         "many", "tenants", "at", "once", "with", "prompts", "that", "share", "long", "system", "instructions"]


# ----------------------------------------------------------------------------------------------- children


def metrics_padding(families: int, buckets: int = 30) -> str:
    """Histogram families of the size a vLLM server exposes beside the gauges the router reads (60 of 30 buckets:
    ~2,000 lines, ~150 KB), which the gateway's scrape must filter out."""
    labels = '{engine="0",model_name="bench"}'
    lines: list[str] = []
    for f in range(families):
        lines += [f"# HELP vllm:hist_{f} latency", f"# TYPE vllm:hist_{f} histogram"]
        lines += [f'vllm:hist_{f}_bucket{{engine="0",le="{b * 0.5}",model_name="bench"}} {b * 7.0}'
                  for b in range(buckets)]
        lines += [f"vllm:hist_{f}_sum{labels} 1.5", f"vllm:hist_{f}_count{labels} 3.0"]
    return "".join(line + "\n" for line in lines)


def engine_child(ports: list[int], *, itl_ms: float, prefill_ms: float, metrics_families: int) -> None:
    """Two fake engines in one process (one core's worth of work; the gateway is what is measured), their
    `/metrics` padded to a vLLM server's size."""
    import uvloop
    from aiohttp import web

    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

    padding = metrics_padding(metrics_families)

    def padded(engine: FakeEngine) -> Any:
        plain = engine._metrics

        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=(await plain(request)).text + padding, content_type="text/plain")

        return handler

    async def run() -> None:
        config = FakeEngineConfig(model="bench", prefill_delay_s=prefill_ms / 1000,
                                  inter_token_delay_s=itl_ms / 1000, step_sync=True)
        for port in ports:
            engine = FakeEngine(config, port=port)
            engine._metrics = padded(engine)  # type: ignore[method-assign]
            await engine.start()
        await asyncio.sleep(3600)

    uvloop.run(run())


class StallSampler:
    """A thread that samples the loop thread's stack while the loop has not run its watch timer for `stall_s`.
    `beat()` is called by that timer. Samples are counted per stack (innermost frames last)."""

    def __init__(self, stall_s: float, every_s: float = 0.001) -> None:
        self.stall_s, self.every_s = stall_s, every_s
        self.last = time.perf_counter()
        self.thread_id = threading.get_ident()
        self.stacks: collections.Counter[str] = collections.Counter()
        self.stopped = False
        self.cpu = time.thread_time()
        self.gaps: list[tuple[float, float, float]] = []  # (wall time, wall gap s, the loop thread's CPU s in it)

    def beat(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if now - self.last >= self.stall_s:
            self.gaps.append((time.time(), now - self.last, cpu - self.cpu))
        self.last, self.cpu = now, cpu

    def start(self) -> None:
        # hand the GIL over every 0.2 ms (CPython's default: 5 ms), so a sample lands where the loop is, not only
        # where it releases the GIL for a system call
        sys.setswitchinterval(0.0002)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stopped:
            time.sleep(self.every_s)
            if time.perf_counter() - self.last < self.stall_s:
                continue
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            frames = traceback.extract_stack(frame)[-14:]
            self.stacks[" <- ".join(f"{Path(f.filename).name}:{f.name}:{f.lineno}" for f in reversed(frames))] += 1


def gateway_child(config: str, out: Path, *, variant: str, stall_ms: float, stacks: bool, profile: bool) -> None:
    import cProfile
    import io
    import pstats

    import uvloop

    from fleetgate.bench.live_gateway import load_yaml
    from fleetgate.bench.loop_watch import LoopWatch
    from fleetgate.core.config import parse_model
    from fleetgate.gateway.serve import build_server
    from fleetgate.gateway.settings import GatewaySettings

    settings = parse_model(GatewaySettings, load_yaml(config), source=config)
    VARIANTS[variant]()
    server = build_server(settings, freeze_heap=True)
    watch = LoopWatch(every_s=0.001)
    sampler = StallSampler(stall_ms / 1000)
    tick = watch._tick

    def tick_and_beat() -> None:
        sampler.beat()
        tick()

    watch._tick = tick_and_beat  # type: ignore[method-assign]
    startup, shutdown = server.startup, server.shutdown
    profiler = cProfile.Profile()

    async def startup_then_watch(sockets: Any = None) -> None:
        await startup(sockets=sockets)
        watch.start()
        sampler.beat()
        if stacks:
            sampler.start()
        if profile:
            profiler.enable()

    async def dump_then_shutdown(sockets: Any = None) -> None:
        watch.stop()
        sampler.stopped = True
        if profile:
            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats(os.environ.get("BENCH_PROFILE_SORT", "tottime")).print_stats(60)
            stats.print_callees(os.environ.get("BENCH_PROFILE_CALLEES", "scheduler.py:83"))
            out.with_suffix(".prof.txt").write_text(text.getvalue())
        out.write_text(json.dumps({"every_s": watch.every_s, "samples": watch.samples, "pauses": watch.pauses,  # noqa: ASYNC240 - once, at shutdown
                                   "stacks": sampler.stacks.most_common(40),
                                   "gaps": sampler.gaps}))
        await shutdown(sockets=sockets)

    server.startup, server.shutdown = startup_then_watch, dump_then_shutdown  # type: ignore[method-assign]

    async def serve() -> None:
        await server.serve()

    uvloop.run(serve())


def old_parse_vllm_metrics(text: str) -> Any:
    """`router.vllm_metrics.parse_vllm_metrics` before its prefixes were built once: the old filter (six prefixes
    built per line), then the parse of the lines it kept (the current function over them costs the same)."""
    from fleetgate.router import vllm_metrics

    wanted = vllm_metrics.WANTED
    lines = [ln for ln in text.splitlines() if ln.startswith(wanted) or ln.startswith(tuple(f"# TYPE {w}"
                                                                                           for w in wanted))]
    return vllm_metrics.parse_vllm_metrics("\n".join(lines) + "\n")


def _before() -> None:
    from fleetgate.router import scraping

    scraping.parse_vllm_metrics = old_parse_vllm_metrics  # type: ignore[assignment]


# `before`: the scrape's parse as before (the baseline); `after`: the gateway as it is; `ramp`: as it is, the
# background's streams started evenly over --ramp-s seconds instead of at once (the same load without the
# synchronised first wave)
VARIANTS: dict[str, Any] = {"before": _before, "after": lambda: None, "ramp": lambda: None}


# ----------------------------------------------------------------------------------------------- parent


def free_port() -> int:
    from fleetgate.core.localredis import free_port as fp

    return fp()


def wait_http(url: str, popen: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {popen.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prompt(i: int, words: int) -> str:
    return f"request {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))


async def stream(session: Any, url: str, key: str, model: str, text: str, tokens: int) -> tuple[float, int]:
    """TTFT (s) and content chunks of one streaming chat request."""
    import orjson

    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
                         "stream": True, "stream_options": {"include_usage": True}})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    start = time.perf_counter()
    ttft, chunks = float("nan"), 0
    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {(await resp.text())[:200]}")
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"t' in line:
                chunks += 1
                if chunks == 1:
                    ttft = time.perf_counter() - start
    return ttft, chunks


async def load_phase(gateway: str, engines: list[str], key: str, args: argparse.Namespace, seed: int,
                     ramp_s: float) -> dict[str, Any]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120))
    counter = [seed * 1_000_000]
    sent: list[float] = []
    stop_at = [0.0]

    async def closed_loop(j: int) -> None:
        await asyncio.sleep(ramp_s * j / args.streams)
        while time.perf_counter() < stop_at[0]:
            counter[0] += 1
            sent.append(time.perf_counter())
            await stream(session, gateway, key, "bench", prompt(counter[0], args.prompt_words), args.tokens)

    added: list[tuple[float, float]] = []  # (time from the start, added TTFT s)

    async def probes(t0: float) -> None:
        k = 0
        while time.perf_counter() < stop_at[0]:
            e = k % len(engines)
            counter[0] += 1
            text = prompt(counter[0], 64)
            pair = [stream(session, gateway, key, f"probe-{e}", text, 2),
                    stream(session, engines[e], key, "bench", text, 2)]
            if k % 2:
                pair.reverse()
            at = time.perf_counter() - t0
            results = await asyncio.gather(*pair)
            if k % 2:
                results.reverse()
            added.append((at, results[0][0] - results[1][0]))
            k += 1
            await asyncio.sleep(args.probe_gap_ms / 1000)

    try:
        # warm the probe path (connections, first-request work) before the burst
        for e in range(len(engines)):
            await stream(session, gateway, key, f"probe-{e}", prompt(0, 8), 2)
            await stream(session, engines[e], key, "bench", prompt(0, 8), 2)
        t0 = time.perf_counter()
        wall0 = time.time()
        stop_at[0] = t0 + args.window_s
        await asyncio.gather(probes(t0), *(closed_loop(j) for j in range(args.streams)))
        elapsed = time.perf_counter() - t0
    finally:
        await session.close()
    return {"wall0": wall0, "elapsed": elapsed, "requests": len(sent), "added": added}


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def one_run(variant: str, engines: list[str], args: argparse.Namespace, workdir: Path, seed: int,
            redis_url: str | None) -> dict[str, Any]:
    import yaml

    from fleetgate.bench.live_gateway import Keys, gateway_settings
    from fleetgate.bench.loop_watch import summary
    from fleetgate.router.config import preset

    keys = Keys.make(1)
    key = keys.tenants["t0"]
    port, metrics_port = free_port(), free_port()
    settings = gateway_settings(port=port, metrics_port=metrics_port, model="bench", urls=engines, keys=keys,
                                routing=preset("default").model_dump(by_alias=True, mode="json"), redis_url=redis_url)
    config = workdir / f"gateway-{variant}-{seed}.yaml"
    config.write_text(yaml.safe_dump(settings))
    out = workdir / f"loop-{variant}-{seed}.json"
    argv = [sys.executable, __file__, "gateway", "--config", str(config), "--out", str(out), "--variant", variant,
            "--stall-ms", str(args.stall_ms), *(["--stacks"] if args.stacks else []),
            *(["--profile"] if args.profile else [])]
    with open(workdir / f"gateway-{variant}-{seed}.log", "wb") as log:
        popen = subprocess.Popen(argv, env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=log,
                                 stderr=subprocess.STDOUT,
                                 preexec_fn=(lambda: os.sched_setaffinity(0, {args.gateway_cpu}))
                                 if args.gateway_cpu is not None else None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/readyz", popen)
        time.sleep(0.5)
        cpu0 = cpu_s(popen.pid)
        spy = (subprocess.Popen([args.py_spy, "record", "--pid", str(popen.pid), "--rate", "500", "--format", "raw",
                                 "--nonblocking", "-d", str(int(args.window_s + 1)),
                                 "-o", str(workdir / f"spy-{variant}-{seed}.txt")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.py_spy else None)
        phase = asyncio.run(load_phase(url, engines, key, args, seed, args.ramp_s if variant == "ramp" else 0.0))
        if spy is not None:
            spy.wait(timeout=60)
            if args.out:
                import shutil

                shutil.copy(workdir / f"spy-{variant}-{seed}.txt", args.out.with_suffix(f".spy-{variant}-{seed}.txt"))
        cpu = cpu_s(popen.pid) - cpu0
    finally:
        popen.terminate()
        popen.wait(timeout=30)
    data = json.loads(out.read_text())
    if args.profile:
        print(out.with_suffix(".prof.txt").read_text()[:9000])
    loop = summary(data, since=phase["wall0"], until=phase["wall0"] + phase["elapsed"])
    burst = summary(data, since=phase["wall0"], until=phase["wall0"] + args.burst_s)
    added = [a for _, a in phase["added"]]
    gaps = [(g, c) for t, g, c in data["gaps"] if phase["wall0"] <= t <= phase["wall0"] + phase["elapsed"]]
    stalled = sum(g for g, _ in gaps)
    return {"variant": variant, "seed": seed, "requests": phase["requests"], "elapsed": phase["elapsed"],
            "cpu_ms_per_request": 1000 * cpu / max(1, phase["requests"] + 2 * len(added)),
            "lag_p99_ms": loop["lag_ms"]["p99"], "lag_max_ms": loop["lag_ms"]["max"],
            "burst_lag_max_ms": burst["lag_ms"]["max"], "gc": loop["gc"],
            "probe_pairs": len(added), "added_mean_ms": 1000 * statistics.fmean(added) if added else float("nan"),
            "added_p90_ms": 1000 * quantile(added, 0.9), "added_max_ms": 1000 * max(added, default=float("nan")),
            "first_probe_added_ms": 1000 * added[0] if added else float("nan"),
            "worst_probes_at_s_ms": sorted(((round(at, 2), round(1000 * a, 1)) for at, a in phase["added"]),
                                           key=lambda p: -p[1])[:6],
            # loop gaps of >= --stall-ms: their wall time, and the share of it the loop thread was on a CPU
            "stalls": len(gaps), "stalls_per_s": len(gaps) / phase["elapsed"], "stalled_ms": 1000 * stalled,
            "stall_cpu_share": sum(c for _, c in gaps) / stalled if stalled else float("nan"),
            "longest_gaps_ms": sorted(((round(1000 * g, 1), round(1000 * c, 1)) for g, c in gaps), reverse=True)[:6],
            "stacks": data.get("stacks", [])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    e = sub.add_parser("engine")
    e.add_argument("--ports", required=True)
    e.add_argument("--itl-ms", type=float, required=True)
    e.add_argument("--prefill-ms", type=float, required=True)
    e.add_argument("--metrics-families", type=int, required=True)
    g = sub.add_parser("gateway")
    g.add_argument("--config", required=True)
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--variant", default="after")
    g.add_argument("--stall-ms", type=float, default=5.0)
    g.add_argument("--stacks", action="store_true")
    g.add_argument("--profile", action="store_true")
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens of a background request")
    parser.add_argument("--prompt-words", type=int, default=1000)
    parser.add_argument("--itl-ms", type=float, default=25.0, help="the engines' step time")
    parser.add_argument("--prefill-ms", type=float, default=30.0)
    parser.add_argument("--window-s", type=float, default=6.0)
    parser.add_argument("--burst-s", type=float, default=1.0, help="the burst's part of the window")
    parser.add_argument("--probe-gap-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="before,after,ramp", help="the first is the baseline of the ratios")
    parser.add_argument("--metrics-families", type=int, default=60,
                        help="histogram families padding each fake engine's /metrics (60: ~2,000 lines, as vLLM)")
    parser.add_argument("--ramp-s", type=float, default=1.0, help="the ramp variant's start spread")
    parser.add_argument("--stall-ms", type=float, default=3.0)
    parser.add_argument("--stacks", action="store_true", help="sample the gateway loop's stack while it stalls")
    parser.add_argument("--redis", action="store_true", help="the gateway's state in a redis-server (as run 8c)")
    parser.add_argument("--py-spy", help="a py-spy binary: record the gateway over the window (to --out's folder)")
    parser.add_argument("--profile", action="store_true", help="cProfile the gateway over the window (slows it)")
    parser.add_argument("--gateway-cpu", type=int, default=None, help="pin the gateway to this CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.cmd == "engine":
        engine_child([int(p) for p in args.ports.split(",")], itl_ms=args.itl_ms, prefill_ms=args.prefill_ms,
                     metrics_families=args.metrics_families)
        return 0
    if args.cmd == "gateway":
        gateway_child(args.config, args.out, variant=args.variant, stall_ms=args.stall_ms, stacks=args.stacks,
                      profile=args.profile)
        return 0
    from fleetgate.core.localredis import LocalRedis

    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if args.gateway_cpu is not None:  # the engines and this load generator on the other CPUs
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.gateway_cpu})
    ports = [free_port(), free_port()]
    engines = [f"http://127.0.0.1:{p}" for p in ports]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loopburst-") as tmp:
        workdir = Path(tmp)
        with open(workdir / "engine.log", "wb") as elog:
            engine = subprocess.Popen([sys.executable, __file__, "engine", "--ports", ",".join(map(str, ports)),
                                       "--itl-ms", str(args.itl_ms), "--prefill-ms", str(args.prefill_ms),
                                       "--metrics-families", str(args.metrics_families)],
                                      env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=elog,
                                      stderr=subprocess.STDOUT)
        try:
            for url in engines:
                wait_http(url + "/health", engine)
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    redis = LocalRedis().start() if args.redis else None  # a fresh one per gateway, as the harness
                    try:
                        row = one_run(v, engines, args, workdir, seed=r + 1, redis_url=redis.url if redis else None)
                    finally:
                        if redis is not None:
                            redis.stop()
                    rows.append(row)
                    print(json.dumps({k: (round(x, 3) if isinstance(x, float) else x)
                                      for k, x in row.items() if k != "stacks"}), flush=True)
                    for stack, n in row["stacks"][:12]:
                        print(f"    {n:5d}  {stack}", flush=True)
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    report(rows, variants)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


def report(rows: list[dict[str, Any]], variants: list[str]) -> None:
    keys = ["lag_p99_ms", "lag_max_ms", "burst_lag_max_ms", "stalls_per_s", "stall_cpu_share", "added_mean_ms",
            "added_p90_ms", "added_max_ms", "first_probe_added_ms", "cpu_ms_per_request"]
    means = {v: {k: statistics.fmean(r[k] for r in rows if r["variant"] == v) for k in keys} for v in variants}
    print("\nvariant       " + " ".join(f"{k.removesuffix('_ms'):>13}" for k in keys) + "   (ms where not a rate)")
    for v in variants:
        print(f"{v:13} " + " ".join(f"{means[v][k]:13.2f}" for k in keys))
    base = variants[0]
    for v in variants[1:]:
        print(f"{v + '/' + base:13} " + " ".join(
            f"{means[v][k] / means[base][k] if means[base][k] else float('nan'):13.2f}" for k in keys))


if __name__ == "__main__":
    raise SystemExit(main())
