"""Gateway CPU per request, approximate (`default`) against precise prefix routing (`precise-local`), same requests.

Issue 24: on two GPUs the precise-local gateway spent 8-11 ms of CPU per request against 4-6 ms for the default
profile. This probe reproduces the comparison on loopback: two fake engines (`fleetgate.sim.fake_engine`, in their
own process, streaming `--output-tokens` tokens and publishing their prefix caches as vLLM KV events over ZMQ, block
size 16), one gateway process per point (`fleetgate.bench.live_gateway`, the harness's own child), the harness's
shared-prefix requests (`fleetgate.sim.workloads.shared_prefix`, Gemma 3's 6.48 chars per token), and the gateway's
CPU time from `/proc/PID/stat` over the send window plus the drain. Profiles alternate (`--rounds`), each point on
the same requests. `--step-hz`: besides a batch per request's prefill, each engine publishes a decode-step batch
(`--step-blocks` one-block `BlockStored` events, and the evictions) this often, as vLLM publishes one per scheduler
step that changed its cache. `--idle-s`: the gateway's CPU over that many seconds with no requests (after the point),
the cost that does not scale with requests. A profile named `NAME@before` runs NAME's gateway with `--before-python`
(another checkout's interpreter: the code before a change, in the same run). `--pyspy-s`: record each gateway.

    PYTHONSAFEPATH=1 .venv/bin/python scripts/precise_cpu_probe.py \
        --profiles default,precise-local@before,precise-local \
        --rate 15 --window 30 --rounds 2 --idle-s 5 --step-hz 50 --step-blocks 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = """
import asyncio, random, sys
from fleetgate.router.kv_events import BlockRemoved, BlockStored
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

async def steps(engine, hz, blocks):
    # vLLM publishes a batch per scheduler step that changed its cache: while decoding, the blocks that filled up
    # (here `blocks` one-block BlockStored events chained onto a stored parent) and, when full, the evicted ones
    rng, held = random.Random(engine.port), []
    while True:
        await asyncio.sleep(1 / hz)
        cache = engine.kv_cache
        if cache is None:
            continue
        events, new = [], []
        for _ in range(blocks):
            h = rng.getrandbits(64)
            events.append(BlockStored(block_hashes=(h,), parent_block_hash=held[-1] if held else None,
                                      token_ids=tuple(rng.randrange(50000) for _ in range(16)), block_size=16,
                                      medium="GPU", group_idx=0, spec_kind="full_attention"))
            held.append(h)
        if len(held) > 4 * blocks:
            gone, held[:] = held[:blocks], held[blocks:]
            events.append(BlockRemoved(block_hashes=tuple(gone), medium="GPU", group_idx=0))
        await cache.publisher.publish(events)

async def main(sockdir, n, prefill, itl, cap, hz, blocks):
    engines = []
    for i in range(n):
        cfg = FakeEngineConfig(model="llama-3.1-8b", prefill_delay_s=prefill, inter_token_delay_s=itl,
                               default_max_tokens=64, kv_events=f"ipc://{sockdir}/e{i}",
                               kv_replay=f"ipc://{sockdir}/r{i}", kv_block_size=16, kv_capacity_blocks=cap)
        engines.append(await FakeEngine(cfg).start())
    tasks = [asyncio.create_task(steps(e, hz, blocks)) for e in engines if hz > 0]
    print("URLS " + " ".join(e.url for e in engines), flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
                 float(sys.argv[6]), int(sys.argv[7])))
"""
BEFORE = "@before"
MODEL_DIR = Path.home() / ".cache/fleetgate/models/gemma-3-270m-bfloat16"


def start_engines(sockdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", ENGINES, str(sockdir), str(args.engines), str(args.prefill_s),
                             str(args.itl_s), str(args.capacity_blocks), str(args.step_hz), str(args.step_blocks)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("URLS "):
        proc.kill()
        raise RuntimeError(f"fake engines did not start: {line!r}")
    return proc, line.split()[1:]


def start_pyspy(pid: int, out: Path, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """py-spy recording `pid` for `--pyspy-s` seconds into `out` (raw collapsed stacks), when asked."""
    if args.pyspy_s <= 0:
        return None
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "-r", "200", "-d", str(int(args.pyspy_s)),
            "-p", str(pid), "-f", "raw", "-o", str(out), "--threads",
            *(["--native"] if args.native else ["--nonblocking"])]
    with open(out.with_suffix(".err"), "wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)


async def point(profile: Any, *, urls: list[str], sockdir: Path, keys: Any, workdir: Path, items: list[Any],
                args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from fleetgate.bench.live_client import replay
    from fleetgate.bench.live_gateway import kv_event_routes, start_gateway
    from fleetgate.bench.live_workloads import Target, to_requests

    routes = kv_event_routes(urls=urls, publishers=[f"ipc://{sockdir}/e{i}" for i in range(len(urls))],
                             replays=[f"ipc://{sockdir}/r{i}" for i in range(len(urls))], topic="")
    here = sys.executable
    if profile.name.endswith(BEFORE):  # the gateway of the code before the change (`--before-python`'s checkout)
        sys.executable = args.before_python
    try:
        gw = await asyncio.to_thread(start_gateway, profile, model="llama-3.1-8b", urls=urls, keys=keys,
                                     workdir=workdir, timeout_s=180, kv_events=routes)
    finally:
        sys.executable = here
    try:
        await asyncio.sleep(1.0)  # subscriptions connect and replay
        requests = to_requests(items, target=Target(url=gw.url, model="llama-3.1-8b", keys=keys.tenants), tenants=1,
                               output_tokens=args.output_tokens)
        load0 = os.getloadavg()[0]
        spy = start_pyspy(gw.popen.pid, workdir / f"pyspy-{profile.name}-{gw.popen.pid}.txt", args)
        cpu0, t0, started = gw.cpu_s(), time.monotonic(), time.time()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            results, _ = await replay(session, requests, drain_deadline_s=args.window + 30, send_until_s=args.window)
        cpu, wall = gw.cpu_s() - cpu0, time.monotonic() - t0
        ok = sum(1 for r in results if r.status == 200 and r.error is None)
        idle_cpu = 0.0
        if args.idle_s > 0:
            c0 = gw.cpu_s()
            await asyncio.sleep(args.idle_s)
            idle_cpu = gw.cpu_s() - c0
        if spy is not None:
            await asyncio.to_thread(spy.wait)
        return {"profile": profile.name, "started_at": round(started, 1),
                "requests": len(results), "ok": ok, "cpu_s": round(cpu, 3),
                "wall_s": round(wall, 2), "cpu_ms_per_req": round(1000 * cpu / max(1, len(results)), 3),
                "idle_cpu_ms_per_s": round(1000 * idle_cpu / args.idle_s, 2) if args.idle_s > 0 else None,
                "load1": round(load0, 2), "endpoints": _split(results)}
    finally:
        await asyncio.to_thread(gw.stop)


def _split(results: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        out[str(r.endpoint)] = out.get(str(r.endpoint), 0) + 1
    return out


async def main(args: argparse.Namespace) -> None:
    from fleetgate.bench.live_gateway import Keys, resolve_profile, template_vars
    from fleetgate.sim.workloads import shared_prefix

    workdir = Path(tempfile.mkdtemp(prefix="pcpu-"))
    sockdir = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    engines, urls = start_engines(sockdir, args)
    try:
        variables = template_vars(urls=urls, kv_events=[], model_dir=str(args.model_dir), block_size=16)
        configs = {"precise-local": Path(args.precise_config)}
        profiles = [dataclasses.replace(resolve_profile(p.removesuffix(BEFORE), configs=configs, variables=variables),
                                        name=p) for p in args.profiles.split(",")]
        n = round(args.rate * args.window * 1.2)
        items = shared_prefix(seed=args.seed, groups=args.groups, prompts_per_group=max(1, n // args.groups + 1),
                              prefix_tokens=2048, question_tokens=96, max_tokens=args.output_tokens,
                              rate_rps=args.rate, chars_per_token=6.48)
        items = [i for i in items if i.arrival_s < args.window]
        keys = Keys.make(1)
        rows = []
        for r in range(args.rounds):
            order = profiles if r % 2 == 0 else profiles[::-1]
            for profile in order:
                row = await point(profile, urls=urls, sockdir=sockdir, keys=keys, workdir=workdir, items=items,
                                  args=args)
                row["round"] = r
                print(json.dumps(row), flush=True)
                rows.append(row)
        for p in profiles:
            mine = [x["cpu_ms_per_req"] for x in rows if x["profile"] == p.name]
            print(f"{p.name}: cpu ms/req {mine} mean {sum(mine) / len(mine):.2f}")
        print(f"gateway logs in {workdir}")
    finally:
        engines.terminate()
        engines.wait(timeout=10)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default="default,precise-local",
                   help=f"a name ending in {BEFORE} runs that profile's gateway with --before-python")
    p.add_argument("--before-python", default="/work/main/.venv/bin/python",
                   help="the interpreter of a checkout with the code before the change")
    p.add_argument("--precise-config", default="router/examples/precise-prefix-gpu.yaml")
    p.add_argument("--model-dir", default=str(MODEL_DIR))
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--groups", type=int, default=48)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--prefill-s", type=float, default=0.03)
    p.add_argument("--itl-s", type=float, default=0.01)
    p.add_argument("--capacity-blocks", type=int, default=4096)
    p.add_argument("--step-hz", type=float, default=0.0, help="decode-step KV batches per second per engine")
    p.add_argument("--step-blocks", type=int, default=4, help="blocks stored per decode step")
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--pyspy-s", type=float, default=0.0, help="record each point with py-spy for this long")
    p.add_argument("--native", action="store_true", help="py-spy --native")
    p.add_argument("--seed", type=int, default=73)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
