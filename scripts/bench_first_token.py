"""The gateway's added time to first token on the GPU harness's exact path, checkouts side by side (issue 24).

The gateway of `fleetgate.bench.live_gateway` (API-key tenants, accounting, cache off, routing profile `default`
of `fleetgate.router.config.preset`, model `probe-<k>` routed to engine k alone) in front of two fake engines
(`fleetgate.sim.fake_engine`, `--itl-ms` between tokens), or in front of running engines (`--engine-url`,
repeated, with `--model`: e.g. the GPU host's vLLM engines). Per round, one gateway per checkout (`--python
NAME=PATH`: that venv's python runs the gateway; the order alternates by round). Pairs of the same
`/v1/completions` probe (a ~256-token shared prefix and a short unique suffix, 4 tokens, as
`live_overhead.Prober` sends) go one after the other to the gateway (as `probe-<k>`) and straight to engine k;
the added TTFT of a pair is the gateway's minus the direct one's. First idle, then while `--load` closed-loop
background streams of `--load-tokens` tokens run through the gateway. The gateway's CPU per idle request is read
from `/proc`.

`--floor`: also a bare uvicorn + aiohttp streaming relay (same server stack as the gateway, no logic) in front of
engine 0: what any Python HTTP hop adds, idle. `--stages`: the gateway runs under
`fleetgate.bench.first_token_stages` and its per-stage medians (arrival -> auth -> admission -> routing -> engine
call -> headers -> first chunk written) are printed per round. `--vllm-chunk-cost` (alone): what the
`continuous_usage_stats` the gateway asks engines for costs vLLM per chunk (needs vLLM in the venv).

    python scripts/bench_first_token.py --python main=/work/main/.venv/bin/python \
        --python new=.venv/bin/python --rounds 2 --floor --stages
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from fleetgate.bench.gateway_stack import terminate
from fleetgate.bench.live_gateway import Keys, gateway_settings, http_ok
from fleetgate.core.localredis import free_port
from fleetgate.router.config import preset
from fleetgate.sim.workloads import _text

FAKE_MODEL = "fake-model"
STAGES_SCRIPT = Path(__file__).resolve().parents[1] / "fleetgate" / "bench" / "first_token_stages.py"
FLOOR = "floor"


def probe_prefix() -> str:
    return "[probe] " + _text(random.Random("probe-prefix"), 256, chars_per_token=4.0)


def completion(model: str, prompt: str, max_tokens: int) -> bytes:
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})


async def ttft(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]) -> float:
    """Seconds from sending to the first content chunk (the stream is read to its end)."""
    t0 = time.perf_counter()
    first = float("nan")
    async with session.post(url + "/v1/completions", data=data, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
        async for line in r.content:
            if first != first and line.startswith(b"data: {") and b'"text"' in line:
                first = time.perf_counter() - t0
    return first


def cpu_s(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")


def start(argv: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    """Start `argv` (output to `log`) and wait until GET `url` answers 200 (60 s at most)."""
    with open(log, "wb") as f:
        popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, "PYTHONSAFEPATH": "1"})
    t0 = time.monotonic()
    while not http_ok(url):
        if popen.poll() is not None or time.monotonic() - t0 > 60:
            popen.kill()
            popen.wait()
            raise RuntimeError(f"{argv} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return popen


class Probe:
    """One gateway (or the floor) under test, and the engines its probes are paired with."""

    def __init__(self, *, url: str, engines: list[str], model: str, keys: Keys, floor: bool) -> None:
        self.url, self.engines, self.model, self.floor = url, engines[:1] if floor else engines, model, floor
        self.auth = {"Content-Type": "application/json", "Authorization": f"Bearer {keys.tenants['t0']}"}
        self.plain = {"Content-Type": "application/json"}
        self.prefix = probe_prefix()
        self.n = 0

    async def pair(self, session: aiohttp.ClientSession, i: int) -> float:
        """Added TTFT (s) of one pair, sent one after the other; which goes first alternates."""
        self.n += 1
        k = i % len(self.engines)
        prompt = f"{self.prefix}\nprobe {self.n}"
        via = ((self.url, completion(self.model, prompt, 4), self.plain) if self.floor else
               (self.url, completion(f"probe-{k}", prompt, 4), self.auth))
        direct = (self.engines[k], completion(self.model, prompt, 4), self.plain)
        order = [via, direct] if (i // len(self.engines)) % 2 == 0 else [direct, via]
        got = [await ttft(session, *x) for x in order]
        return got[order.index(via)] - got[order.index(direct)]


async def measure(probe: Probe, args: argparse.Namespace, pid: int,
                  after_idle: Callable[[], Awaitable[Any]] | None = None) -> dict[str, Any]:
    """Idle pairs, then (`after_idle` called between) pairs under background load."""
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(8):  # warm connections, code paths and the engines' prefix cache
            await probe.pair(session, i)
        c0 = cpu_s(pid)
        idle = [await probe.pair(session, i) for i in range(args.pairs)]
        cpu_idle = (cpu_s(pid) - c0) / args.pairs
        row: dict[str, Any] = {"idle": idle, "loaded": [], "cpu_ms_per_idle_request": 1000 * cpu_idle,
                               "background": 0}
        if after_idle is not None:
            row["stages"] = await after_idle()
        if probe.floor or args.load <= 0:
            return row
        stop_at = time.perf_counter() + args.duration

        async def background(j: int) -> int:
            done = 0
            while time.perf_counter() < stop_at:
                data = completion(probe.model, f"background {j} {done} {probe.prefix}", args.load_tokens)
                await ttft(session, probe.url, data, probe.auth)
                done += 1
            return done

        tasks = [asyncio.create_task(background(j)) for j in range(args.load)]
        await asyncio.sleep(0.5)
        i = 0
        while time.perf_counter() < stop_at - 0.2:
            row["loaded"].append(await probe.pair(session, i))
            i += 1
            await asyncio.sleep(args.probe_interval_s)
        row["background"] = sum(await asyncio.gather(*tasks))
    return row


def summary(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    p90 = xs[int(0.9 * (len(xs) - 1))]
    return (f"mean {1000 * statistics.fmean(xs):.3f} ms, median {1000 * statistics.median(xs):.3f} ms, "
            f"p90 {1000 * p90:.3f} ms (n={len(xs)})")


def stage_report(popen: subprocess.Popen[bytes], out: Path) -> dict[str, Any] | None:
    """Ask the timed gateway for its per-stage medians (it writes them to `out` on SIGUSR1)."""
    popen.send_signal(signal.SIGUSR1)
    for _ in range(100):
        if out.exists():
            return dict(json.loads(out.read_text()))
        time.sleep(0.05)
    return None


def gateway_argv(name: str, py: str, *, cfg: Path, port: int, engine: str, stages: Path | None) -> list[str]:
    if name == FLOOR:
        return [py, __file__, "--serve-floor", str(port), engine]
    if stages is not None:
        # run as a file: the other checkout's venv may predate the module; it times that venv's gateway
        return [py, str(STAGES_SCRIPT), str(cfg), str(stages)]
    return [py, "-m", "fleetgate.bench.live_gateway", str(cfg)]


async def one_gateway(name: str, py: str, *, r: int, urls: list[str], model: str, keys: Keys,
                      routing: dict[str, Any], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    port, metrics_port = free_port(), free_port()
    cfg = work / f"gw-{name}-{r}.yaml"
    cfg.write_text(yaml.safe_dump(gateway_settings(port=port, metrics_port=metrics_port, model=model, urls=urls,
                                                   keys=keys, routing=routing)))
    stages = work / f"stages-{name}-{r}.json" if args.stages and name != FLOOR else None
    url = f"http://127.0.0.1:{port}"
    argv = gateway_argv(name, py, cfg=cfg, port=port, engine=urls[0], stages=stages)
    popen = await asyncio.to_thread(start, argv, url + ("/" if name == FLOOR else "/readyz"),
                                    work / f"gw-{name}-{r}.log")
    try:
        probe = Probe(url=url, engines=urls, model=model, keys=keys, floor=name == FLOOR)
        res = await measure(probe, args, popen.pid, after_idle=None if stages is None else partial(
            asyncio.to_thread, stage_report, popen, stages))
    finally:
        await asyncio.to_thread(terminate, popen)
    res["load"] = os.getloadavg()[0]
    return res


async def main_async(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    pythons = [p.split("=", 1) for p in args.python] + ([[FLOOR, sys.executable]] if args.floor else [])
    work = Path(tempfile.mkdtemp(prefix="first-token-"))
    engines: list[subprocess.Popen[bytes]] = []
    urls: list[str] = list(args.engine_url or [])
    model = args.model if urls else FAKE_MODEL
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in pythons}
    try:
        for e in range(0 if urls else 2):
            port = free_port()
            argv = [sys.executable, "-m", "fleetgate.sim.fake_engine", "--port", str(port), "--model", FAKE_MODEL,
                    "--itl-ms", str(args.itl_ms), "--prefill-ms", str(args.prefill_ms)]
            url = f"http://127.0.0.1:{port}"
            engines.append(await asyncio.to_thread(start, argv, url + "/health", work / f"engine{e}.log"))
            urls.append(url)
        keys = Keys.make(2)
        routing = preset(args.profile).model_dump(by_alias=True, mode="json")
        for r in range(args.rounds):
            for name, py in pythons if r % 2 == 0 else list(reversed(pythons)):
                res = await one_gateway(name, py, r=r, urls=urls, model=model, keys=keys, routing=routing,
                                        work=work, args=args)
                results[name].append(res)
                print(f"round {r} {name}: idle {summary(res['idle'])}; loaded {summary(res['loaded'])}; "
                      f"CPU {res['cpu_ms_per_idle_request']:.2f} ms per idle request; background "
                      f"{res['background']}; load {res['load']:.2f}", flush=True)
                if res.get("stages"):
                    print(f"  stages (ms, medians over the idle phase): {json.dumps(res['stages'])}", flush=True)
    finally:
        for popen in engines:
            await asyncio.to_thread(terminate, popen)
    for name, rows in results.items():
        idle = [x for row in rows for x in row["idle"]]
        loaded = [x for row in rows for x in row["loaded"]]
        cpu = statistics.fmean(row["cpu_ms_per_idle_request"] for row in rows)
        print(f"ALL {name}: idle {summary(idle)}; loaded {summary(loaded)}; CPU {cpu:.2f} ms per idle request")
    return results


def serve_floor(port: int, engine_url: str) -> None:
    """The floor: a bare ASGI app on uvicorn (uvloop, httptools, as the gateway runs) relaying each POST to the
    engine with one pooled aiohttp session, streaming each read back as it comes; no parsing, no stages."""
    import uvicorn

    state: dict[str, aiohttp.ClientSession] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    state["s"] = aiohttp.ClientSession(auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await state["s"].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        headers = {"Content-Type": "application/json", "User-Agent": "floor", "Accept-Encoding": "identity"}
        async with state["s"].post(engine_url + scope["path"], data=body, headers=headers) as r:
            await send({"type": "http.response.start", "status": r.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            while data := await r.content.readany():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning")


def vllm_chunk_cost(rounds: int = 3, n: int = 20_000) -> None:
    """What `stream_options.continuous_usage_stats` (which the gateway adds upstream) costs vLLM per streamed chunk:
    its completion server builds each chunk as below and, with the option, a `UsageInfo` on it (vLLM's own classes,
    from the vLLM installed in this venv; the option reaches nothing else in vLLM)."""
    import timeit

    from vllm.entrypoints.openai.completion.protocol import CompletionResponseStreamChoice, CompletionStreamResponse
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    def chunk(usage: bool) -> str:
        c = CompletionStreamResponse(id="cmpl-0", object="text_completion", created=1, model="m", choices=[
            CompletionResponseStreamChoice(index=0, text=" word", logprobs=None, finish_reason=None, stop_reason=None,
                                           prompt_token_ids=None, token_ids=None)])
        if usage:
            c.usage = UsageInfo(prompt_tokens=260, completion_tokens=3, total_tokens=263)
        return f"data: {c.model_dump_json(exclude_unset=True)}\n\n"

    for _ in range(rounds):
        plain = timeit.timeit(lambda: chunk(False), number=n) / n
        usage = timeit.timeit(lambda: chunk(True), number=n) / n
        print(f"vLLM completion chunk: {1e6 * plain:.2f} us; with continuous usage {1e6 * usage:.2f} us "
              f"(+{1e6 * (usage - plain):.2f} us)")


def main() -> None:
    if sys.argv[1:2] == ["--serve-floor"]:
        serve_floor(int(sys.argv[2]), sys.argv[3])
        return
    if sys.argv[1:2] == ["--vllm-chunk-cost"]:
        vllm_chunk_cost()
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", action="append", required=True, help="NAME=PATH of a venv's python")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pairs", type=int, default=200, help="idle pairs per gateway")
    p.add_argument("--duration", type=float, default=6.0, help="seconds of the loaded phase")
    p.add_argument("--load", type=int, default=16, help="background streams (closed loop); 0: idle only")
    p.add_argument("--load-tokens", type=int, default=64)
    p.add_argument("--itl-ms", type=float, default=8.0, help="fake engines' time between tokens")
    p.add_argument("--prefill-ms", type=float, default=0.0, help="fake engines' time to the first token")
    p.add_argument("--probe-interval-s", type=float, default=0.02)
    p.add_argument("--profile", default="default", help="routing preset")
    p.add_argument("--engine-url", action="append", help="a running engine (repeat); default: two fake engines")
    p.add_argument("--model", default=FAKE_MODEL, help="the running engines' served model name")
    p.add_argument("--floor", action="store_true", help="also a bare uvicorn + aiohttp relay to engine 0 (idle)")
    p.add_argument("--stages", action="store_true", help="per-stage medians from inside each gateway")
    p.add_argument("--out", type=Path, help="write every pair's figures here (JSON)")
    args = p.parse_args()
    results = asyncio.run(main_async(args))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
