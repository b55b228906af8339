"""The gateway's CPU per streamed token and per request, and its added TTFT under streaming load, for two
checkouts of the gateway side by side (issue 24: "the gateway at GPU speed").

One fake engine (`fleetgate.sim.fake_engine`, paced at `--itl-ms` between tokens, like a GPU engine's steps)
and, per round, one gateway per checkout in turn (`--python NAME=PATH`: that venv's python runs
`fleetgate gateway`, the shipped stages with cache off as in `fleetgate bench gateway`'s "full, cache off"),
pinned to CPU 0 while the engine and this load generator run on the others. Each gateway gets two load
phases of `--concurrency` closed-loop streams: `--long` tokens a request, then `--short`; the gateway
process's CPU over each phase gives two equations (requests x per-request + tokens x per-token), solved for
both. During the long phase a prober sends pairs of the same streaming request, one to the gateway and one
straight to the engine, at once, and records the difference of their time to first token (added latency).
Rounds alternate the order of the checkouts so a drift of the shared box's load falls on both.

`--step-sync`: the engine hands every stream its next token at the same instant (`FakeEngineConfig.step_sync`),
one burst of chunks per step as a GPU engine's batched decode does; the gateway relays each burst in one go, and a
probe arriving meanwhile waits behind it (what the GPU run's loaded pairs show). `--loop-probe`: each gateway runs
under `scripts/gateway_loop_probe.py`, which reports its event loop's lag and GC pauses (`loop_*`, `gc_*` rows).
`--procs NAME=N`: NAME's gateway is N processes sharing its port (SO_REUSEPORT), all on the gateway CPU.

    python scripts/bench_stream_cpu.py --python main=/work/main/.venv/bin/python \
        --python new=$PWD/.venv/bin/python --rounds 3 --concurrency 100 --itl-ms 25 --step-sync --loop-probe
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from fleetgate.bench.gateway_stack import MODEL, Pinning, Proc, Stack, _wait_http, gateway_settings, stack
from fleetgate.core.localredis import free_port
from fleetgate.gateway.tenancy.keys import new_key

TEXT = ("the gateway relays every token an engine streams while the fleet serves many tenants at once "
        "with prompts that share long system instructions and differ in their last question")
PROMPT_WORDS = [200]  # set by --prompt-words
LOOP_PROBE = [False]  # set by --loop-probe


def body(tokens: int) -> bytes:
    """A streaming chat request for `tokens` tokens; its prompt is a system message of `--prompt-words` words
    (the fake engine counts a token a word) and a short question."""
    words = TEXT.split()
    system = " ".join(words[i % len(words)] for i in range(PROMPT_WORDS[0]))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Tell me a long story please"}]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0.8,
                         "stream": True})


async def one_stream(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]) -> tuple[
        float, int]:
    """(seconds to the first content chunk, content chunks)."""
    t0 = time.perf_counter()
    first = float("nan")
    chunks = 0
    async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: status {r.status}: {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"t' in line:
                if chunks == 0:
                    first = time.perf_counter() - t0
                chunks += 1
    return first, chunks


async def load(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str], *, concurrency: int,
               duration_s: float) -> tuple[int, int]:
    """(requests completed, content chunks received) by closed-loop streams for `duration_s`."""
    deadline = time.perf_counter() + duration_s
    done = [0, 0]

    async def worker() -> None:
        while time.perf_counter() < deadline:
            _, chunks = await one_stream(session, url, data, headers)
            done[0] += 1
            done[1] += chunks

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done[0], done[1]


async def probes(session: aiohttp.ClientSession, gateway: str, engine: str, headers: dict[str, str],
                 stop: asyncio.Event, interval_s: float) -> list[float]:
    """TTFT(gateway) - TTFT(direct) of pairs sent at once, until `stop`."""
    data = body(4)
    added: list[float] = []
    while not stop.is_set():
        (g, _), (d, _) = await asyncio.gather(one_stream(session, gateway, data, headers),
                                              one_stream(session, engine, data, headers))
        added.append(g - d)
        await asyncio.sleep(interval_s)
    return added


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Gateways:
    """One gateway: `procs` processes serving one port (SO_REUSEPORT when several)."""

    procs: list[Proc]
    url: str
    loop_files: list[Path]

    def cpu_s(self) -> float:
        return sum(p.cpu_s() for p in self.procs)


def start_gateway(s: Stack, python: str, *, engine_url: str, key_hash: str, procs: int = 1) -> Gateways:
    port = free_port()
    settings = gateway_settings(kind="full, cache off", port=port, engine_url=engine_url, key_hash=key_hash,
                                embedder="", log_requests=True)
    config = s.tmp / f"gateway-{port}.yaml"
    config.write_text(yaml.safe_dump(settings))
    cpus = s.pinning.gateway

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    gw = Gateways(procs=[], url=f"http://127.0.0.1:{port}", loop_files=[])
    for i in range(procs):
        argv = [python, "-m", "fleetgate", "gateway", "--config", str(config)]
        if LOOP_PROBE[0]:  # the same gateway, its event loop watched (`gateway_loop_probe.py`)
            gw.loop_files.append(s.tmp / f"loop-{port}-{i}.json")
            argv = [python, str(Path(__file__).with_name("gateway_loop_probe.py")), "--config", str(config),
                    "--out", str(gw.loop_files[-1]), *(["--reuse-port"] if procs > 1 else [])]
        popen = subprocess.Popen(argv, env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, preexec_fn=pin, cwd="/")
        proc = Proc(name=python, popen=popen, url=gw.url)
        s.procs.append(proc)
        gw.procs.append(proc)
        _wait_http(proc.url + "/readyz", timeout_s=60, proc=popen)
    return gw


async def measure(args: argparse.Namespace, s: Stack) -> dict[str, list[dict[str, Any]]]:
    key, key_hash = new_key()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    port = free_port()
    engine = s.start_process("engine", ["fleetgate.sim.fake_engine", "--port", str(port), "--model", MODEL,
                                        "--itl-ms", str(args.itl_ms), *(["--step-sync"] if args.step_sync else [])],
                             url=f"http://127.0.0.1:{port}", ready="/health", cpus=s.pinning.others)
    pythons = dict(p.split("=", 1) for p in args.python)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in pythons}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for rnd in range(args.rounds):
            order = list(pythons.items()) if rnd % 2 == 0 else list(reversed(pythons.items()))
            for name, python in order:
                gw = start_gateway(s, python, engine_url=engine.url, key_hash=key_hash,
                                   procs=args.procs.get(name, 1))
                await load(session, gw.url, body(args.short), headers, concurrency=args.concurrency, duration_s=1.0)
                row: dict[str, Any] = {"round": rnd}
                stop = asyncio.Event()
                prober = asyncio.create_task(probes(session, gw.url, engine.url, headers, stop, args.probe_interval_s))
                for phase, tokens in (("long", args.long), ("short", args.short)):
                    cpu0, t0 = gw.cpu_s(), time.perf_counter()
                    requests, chunks = await load(session, gw.url, body(tokens), headers,
                                                  concurrency=args.concurrency, duration_s=args.duration)
                    row[phase] = {"cpu_s": gw.cpu_s() - cpu0, "requests": requests, "chunks": chunks,
                                  "wall_s": time.perf_counter() - t0}
                    if phase == "long":
                        stop.set()
                        row["added"] = await prober
                row["load"] = os.getloadavg()[0]
                for proc in gw.procs:
                    s.stop(proc)
                loops = [orjson.loads(f.read_bytes()) for f in gw.loop_files if f.exists()]
                if loops:  # several processes: the one whose loop lagged most at p99
                    row["loop"] = max(loops, key=lambda lp: lp["lag_ms"]["p99"] or 0.0)
                    print(f"round {rnd} {name} loop: {row['loop']}", file=sys.stderr, flush=True)
                results[name].append(row)
                print(f"round {rnd} {name}: {summary([row])}", file=sys.stderr, flush=True)
    return results


def solve(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(CPU s per request, CPU s per token) from the long and short phases of `rows`, summed."""
    a = [sum(r[p]["requests"] for r in rows) for p in ("long", "short")]
    b = [sum(r[p]["chunks"] for r in rows) for p in ("long", "short")]
    c = [sum(r[p]["cpu_s"] for r in rows) for p in ("long", "short")]
    det = a[0] * b[1] - a[1] * b[0]
    per_request = (c[0] * b[1] - c[1] * b[0]) / det
    per_token = (a[0] * c[1] - a[1] * c[0]) / det
    return per_request, per_token


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    per_request, per_token = solve(rows)
    long_cpu = sum(r["long"]["cpu_s"] for r in rows)
    long_chunks = sum(r["long"]["chunks"] for r in rows)
    added = [x for r in rows for x in r["added"]]
    return {"cpu_us_per_token_fit": per_token * 1e6, "cpu_ms_per_request_fit": per_request * 1e3,
            "cpu_us_per_token_long_all_in": long_cpu / max(1, long_chunks) * 1e6,
            "tokens_per_s_long": long_chunks / sum(r["long"]["wall_s"] for r in rows),
            "added_ttft_p50_ms": pct(added, 0.5) * 1e3, "added_ttft_p90_ms": pct(added, 0.9) * 1e3,
            "added_ttft_p99_ms": pct(added, 0.99) * 1e3,
            "added_ttft_mean_ms": statistics.fmean(added) * 1e3 if added else float("nan"), "pairs": len(added),
            "load_avg": statistics.fmean(r["load"] for r in rows), **loop_summary(rows)}


def loop_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The gateway's loop lag (means over rounds of each round's quantile, and the longest) and GC (ms)."""
    loops = [r["loop"] for r in rows if "loop" in r]
    if not loops:
        return {}
    out = {f"loop_lag_{q}_ms": statistics.fmean(lp["lag_ms"][q] for lp in loops) for q in ("mean", "p50", "p90", "p99")}
    out["loop_lag_max_ms"] = max(lp["lag_ms"]["max"] for lp in loops)
    out["gc_collections"] = statistics.fmean(sum(g["count"] for g in lp["gc"].values()) for lp in loops)
    out["gc_total_ms"] = statistics.fmean(sum(g["total_ms"] for g in lp["gc"].values()) for lp in loops)
    out["gc_max_ms"] = max(g["max_ms"] for lp in loops for g in lp["gc"].values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="NAME=PATH of a venv's python")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--itl-ms", type=float, default=8.0, help="the engine's time between tokens")
    parser.add_argument("--long", type=int, default=256, help="tokens a request, long phase")
    parser.add_argument("--short", type=int, default=8, help="tokens a request, short phase")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds a phase")
    parser.add_argument("--probe-interval-s", type=float, default=0.05)
    parser.add_argument("--prompt-words", type=int, default=2048, help="the system prompt's words (tokens)")
    parser.add_argument("--step-sync", action="store_true",
                        help="the engine's tokens on one step clock: a burst of one chunk per stream every step")
    parser.add_argument("--loop-probe", action="store_true",
                        help="run each gateway under scripts/gateway_loop_probe.py: its loop lag and GC pauses")
    parser.add_argument("--procs", action="append", default=[], metavar="NAME=N",
                        help="NAME's gateway as N processes sharing its port (SO_REUSEPORT; needs --loop-probe)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.procs = {name: int(n) for name, n in (p.split("=", 1) for p in args.procs)}
    if args.procs and not args.loop_probe:
        parser.error("--procs needs --loop-probe (its runner binds the shared port)")
    PROMPT_WORDS[0] = args.prompt_words
    LOOP_PROBE[0] = args.loop_probe
    with stack(Pinning.choose(0)) as s:
        results = asyncio.run(measure(args, s))
    report = {name: summary(rows) for name, rows in results.items()}
    names = list(report)
    print(f"\n{os.cpu_count()} CPUs, gateway on CPU 0, load average at the end {os.getloadavg()[0]:.2f}; "
          f"{args.concurrency} streams, itl {args.itl_ms:g} ms, {args.long}/{args.short} tokens, "
          f"prompts of {args.prompt_words} words, {args.rounds} rounds")
    for key in report[names[0]]:
        line = "  ".join(f"{name} {report[name][key]:10.3f}" for name in names)
        ratio = (f"  ratio {names[-1]}/{names[0]} {report[names[-1]][key] / report[names[0]][key]:.3f}"
                 if len(names) > 1 and report[names[0]][key] else "")
        print(f"{key:32s} {line}{ratio}")
    if args.out:
        args.out.write_text(orjson.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": results,
                                          "summary": report}, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
