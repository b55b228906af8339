"""The Endpoint Picker's CPU per streamed request and its added TTFT, two pickers side by side (issue 27).

`python scripts/epp_stream_cpu.py --baseline-python /work/main/.venv/bin/python [--rounds 4] [--streams 32] [--null]`
(docs/reports/epp.md, third session). One simulated vLLM CPU engine in this process; every door its own processes,
as deployed: Envoy alone, Envoy + the picker run by `--baseline-python` (another checkout's interpreter: "before"),
Envoy + the picker run by this interpreter ("after") and, with `--null`, Envoy + the null picker of
`epp_door_cost.py` (the protocol's floor). Both pickers run API keys with one tenant (usage accounted), cache off
and the default routing profile. Per round, doors in alternating order: a load phase (`--streams` concurrent
streamed `/v1/completions` of `--tokens` tokens, `--requests` in all) measuring each picker's and each Envoy's CPU
seconds per request from /proc, with one short prefix-hit probe at a time through the same door (its TTFT under
load); then TTFT at concurrency 1, the doors alternating request by request. Prints the raw figures per round, the
medians and the load average. `--spy-after FILE`: py-spy (raw) of the "after" picker's first load phase;
`--profile-after FILE`: the "after" picker under cProfile (CPU clock). Bounded: every process it starts is stopped.
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
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

ALONE = "envoy alone"
PREFIX = "shared system prompt words " * 200
PROFILE_WRAPPER = """\
import cProfile, signal, sys, time
sys.argv = ["fleetgate", *sys.argv[2:]]
prof = cProfile.Profile(time.process_time)
from fleetgate.cli import main
prof.enable()
try:
    main()
finally:
    prof.disable(); prof.dump_stats(OUT)
"""


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settings(model: str, urls: list[str], key_hash: str) -> dict[str, Any]:
    """API keys with one tenant (its usage accounted), cache off, the default routing profile."""
    return {
        "server": {"auth": "api_key", "metrics_port": None, "log_requests": False},
        "models": [{"name": model, "endpoints": urls}],
        "tenancy": {"tenants": [{"id": "bench", "key_hashes": [key_hash]}]},
        "cache": {"enabled": False},
    }


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes, key: str) -> float:
    """One streamed completion (`live_client.stream_one`, the live benchmarks' client); its TTFT in ms."""
    from fleetgate.bench.live_client import LiveRequest, LiveResult, stream_one

    out = LiveResult(id="", path="door", tenant="bench", group="", sent_s=0.0)
    await stream_one(session, LiveRequest(id="", url=url, body=body, at_s=0.0, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"}), out, t0=time.perf_counter())
    if out.status != 200 or out.ttft_s is None:
        raise RuntimeError(f"{url} answered {out.status} without a first token: {out.error}")
    return out.ttft_s * 1e3


def _body(model: str, prompt: str, tokens: int) -> bytes:
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                         "stream_options": {"include_usage": True}})


async def _load(session: aiohttp.ClientSession, url: str, model: str, key: str, *, requests: int, streams: int,
                tokens: int, seed: int) -> list[float]:
    """`requests` streamed completions, `streams` at a time, and meanwhile one short prefix-hit probe at a time
    through the same door: the probes' TTFTs (ms)."""
    queue = list(range(requests))
    probes: list[float] = []

    async def worker() -> None:
        while queue:
            i = queue.pop()
            await _stream(session, url, _body(model, f"load {seed} {i} " + "word " * 60, tokens), key)

    async def probe() -> None:
        i = 0
        while queue:
            i += 1
            probes.append(await _stream(session, url, _body(model, f"{PREFIX} question {i % 3}", 4), key))

    await asyncio.gather(probe(), *(worker() for _ in range(streams)))
    return probes


async def _ready(session: aiohttp.ClientSession, url: str, model: str, key: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await _stream(session, url, _body(model, "ready", 4), key)
            return
        except (aiohttp.ClientError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def _start_pickers(args: argparse.Namespace, tmp: Path, pickers: dict[str, str], ports: dict[str, int],
                   engine: tuple[str, int], settings: dict[str, Any]) -> dict[str, subprocess.Popen[bytes]]:
    """Each picker in its own process: `fleetgate epp` run by its interpreter, or the null picker."""
    procs = {}
    for name, python in pickers.items():
        config = tmp / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**settings, "epp": {"host": "127.0.0.1", "port": ports[name]}}))
        argv = [python, "-m", "fleetgate", "epp", "--config", str(config)]
        if name == "null":  # the protocol's floor: answers as the picker does, does nothing else
            argv = [python, str(Path(__file__).with_name("epp_door_cost.py")), "--null-picker", str(ports[name]),
                    f"{engine[0]}:{engine[1]}"]
        if name == "after" and args.profile_after:
            wrapper = tmp / "profiled.py"
            wrapper.write_text(f"OUT = {args.profile_after!r}\n" + PROFILE_WRAPPER)
            argv = [python, str(wrapper), "fleetgate", "epp", "--config", str(config)]
        procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       env={**os.environ, "PYTHONSAFEPATH": "1"})
    return procs


def _spy(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200",
                             "-o", args.spy_after, *args.spy_args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def measure(args: argparse.Namespace) -> None:
    from fleetgate.bench.envoy import EnvoyProcess
    from fleetgate.bench.envoy_phase import plain_proxy_config
    from fleetgate.core.localredis import free_port
    from fleetgate.gateway.epp.envoyconfig import envoy_config
    from fleetgate.gateway.tenancy.keys import new_key
    from fleetgate.sim.fleet import start_sim_fleet
    from fleetgate.sim.profile import get_profile

    key, key_hash = new_key()
    profile = get_profile("vllm-cpu-gemma3-270m").with_(time_scale=args.time_scale, max_num_seqs=64)
    pickers = {"before": args.baseline_python, "after": sys.executable}
    if args.null:
        pickers["null"] = sys.executable
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in pickers}  # (picker, envoy) s per request
    ttfts: dict[str, list[float]] = {ALONE: [], **{f"envoy + EPP {n}": [] for n in pickers}}
    loaded: dict[str, list[float]] = {ALONE: [], **{n: [] for n in pickers}}  # probes' TTFTs under load
    alone_cpu: list[float] = []  # Envoy alone's CPU s per request
    async with await start_sim_fleet(replicas=1, profile=profile) as fleet:
        engine = ("127.0.0.1", int(fleet.urls[0].rsplit(":", 1)[1]))
        procs: dict[str, subprocess.Popen[bytes]] = {}
        envoys: dict[str, EnvoyProcess] = {}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                ports = {name: free_port() for name in pickers}
                procs.update(await asyncio.to_thread(_start_pickers, args, Path(tmp), pickers, ports, engine,
                                                     _settings(fleet.model, fleet.urls, key_hash)))
                alone = free_port()
                envoys[ALONE] = EnvoyProcess(plain_proxy_config(listen=alone, upstream=engine))
                urls = {ALONE: f"http://127.0.0.1:{alone}"}
                for name in pickers:
                    listen = free_port()
                    envoys[name] = EnvoyProcess(envoy_config(listen=("127.0.0.1", listen),
                                                             epp=("127.0.0.1", ports[name]), pool=[engine],
                                                             health_interval_s=0.2))
                    urls[f"envoy + EPP {name}"] = f"http://127.0.0.1:{listen}"
                for envoy in envoys.values():
                    await asyncio.to_thread(envoy.__enter__)
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                    for url in urls.values():
                        await _ready(session, url, fleet.model, key)
                    loads = 0.0
                    for r in range(args.rounds):
                        order = [*pickers, ALONE] if r % 2 == 0 else [ALONE, *reversed(pickers)]
                        for name in order:
                            if name == ALONE:
                                e0 = envoys[ALONE].cpu_s()
                                loaded[ALONE] += await _load(session, urls[ALONE], fleet.model, key,
                                                             requests=args.requests, streams=args.streams,
                                                             tokens=args.tokens, seed=r)
                                alone_cpu.append((envoys[ALONE].cpu_s() - e0) / args.requests)
                                continue
                            pid = procs[name].pid
                            spy = (await asyncio.to_thread(_spy, args, pid)
                                   if args.spy_after and name == "after" and r == 0 else None)
                            p0, e0 = _proc_cpu_s(pid), envoys[name].cpu_s()
                            loaded[name] += await _load(session, urls[f"envoy + EPP {name}"], fleet.model, key,
                                                        requests=args.requests, streams=args.streams,
                                                        tokens=args.tokens, seed=r)
                            cpu[name].append(((_proc_cpu_s(pid) - p0) / args.requests,
                                              (envoys[name].cpu_s() - e0) / args.requests))
                            loads = max(loads, os.getloadavg()[0])
                            if spy is not None:
                                spy.send_signal(2)
                                await asyncio.to_thread(spy.wait, 30)
                        names = list(urls) if r % 2 == 0 else list(reversed(urls))
                        for i in range(args.latency_requests):
                            for door in names:
                                body = _body(fleet.model, f"{PREFIX} question {i % 3}", 8)
                                ttfts[door].append(await _stream(session, urls[door], body, key))
            finally:
                for envoy in envoys.values():
                    await asyncio.to_thread(envoy.__exit__, None, None, None)
                for proc in procs.values():
                    proc.send_signal(2)
                for proc in procs.values():
                    try:
                        await asyncio.to_thread(proc.wait, 30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    print(f"streamed requests: {args.requests} x {args.rounds} rounds per picker, {args.streams} streams, "
          f"{args.tokens} tokens each, time scale {args.time_scale}; max load average during load {loads:.2f}")
    for name, rows in cpu.items():
        pk = [p * 1e3 for p, _ in rows]
        ev = [e * 1e3 for _, e in rows]
        print(f"  picker {name:<7} CPU ms/request per round {[round(x, 2) for x in pk]}  median "
              f"{statistics.median(pk):.2f}; its Envoy {[round(x, 2) for x in ev]}  median {statistics.median(ev):.2f}")
    print(f"  envoy alone CPU ms/request per round {[round(x * 1e3, 2) for x in alone_cpu]}  median "
          f"{statistics.median(alone_cpu) * 1e3:.2f}")
    print(f"one prefix-hit probe at a time during each load phase, through the same door:\n{_over(loaded)}")
    print(f"TTFT at concurrency 1 ({len(ttfts[ALONE])} requests each, load average {os.getloadavg()[0]:.2f}):\n"
          f"{_over(ttfts)}")


def _over(ttfts: dict[str, list[float]]) -> str:
    """Each door's TTFT p50 and p90, and its p50 over Envoy alone's."""
    base = statistics.median(ttfts[ALONE])
    return "\n".join(
        f"  {door:<20} p50 {statistics.median(v):7.2f} ms  p90 {sorted(v)[int(len(v) * 0.9)]:7.2f} ms  "
        f"p50 over Envoy alone {statistics.median(v) - base:+6.2f} ms ({len(v)} requests)" for door, v in ttfts.items())

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline-python", required=True, help="the interpreter of the 'before' checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="streamed requests per load phase")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--latency-requests", type=int, default=20, help="TTFT requests per door per round")
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--null", action="store_true", help="a third door: Envoy + a null picker (no FleetGate work)")
    parser.add_argument("--profile-after", help="cProfile the 'after' picker into this file")
    parser.add_argument("--spy-after", help="py-spy (raw format) the 'after' picker's first load phase into this file")
    parser.add_argument("--spy-args", nargs="*", default=[], help="more py-spy record arguments (e.g. --native)")
    args = parser.parse_args()
    import uvloop

    uvloop.run(measure(args))


if __name__ == "__main__":
    main()
