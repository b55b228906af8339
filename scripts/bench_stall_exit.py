"""How long a gateway takes to exit on SIGTERM while Redis is stalled, and what it charged of what it owed.

Per N (`--streams`, repeated): a fresh `redis-server` on loopback, two fake engines (one answers, one goes silent
after 3 chunks), and a gateway process (`--python`: the venv whose gateway runs; API-key tenant `acme` with a
daily budget, `server.drain_s` = `--drain`, `server.drain_close_s` = `--close`, `tenancy.redis_timeout_s` =
`--redis-timeout`, more server settings with `--server KEY=VALUE`). One request is answered (so the background
syncs run), N streams are opened on the silent engine, Redis is SIGSTOPped, the gateway SIGTERMed; the time from
SIGTERM to its exit is measured, then Redis gets SIGCONT and, a second later, a fresh in-process gateway on the
same Redis reads the ledger (`/v1/usage`) and the tenant's daily budget counter (`/v1/usage/budgets`).

Owed is what the engines processed (prompt + completion tokens, at the price); `ledger` and `counter` are what
the stalled gateway's writes left in Redis; `reported` is what its exit log says was not written (tokens, from
the `usage not written` lines, when the gateway has them).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_stall_exit.py --streams 1 --streams 8 --streams 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetgate.core.localredis import LocalRedis, free_port
from fleetgate.core.types import Usage
from fleetgate.gateway.serve import build_server, start_in_background
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.keys import hash_key
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}
KEYS = {"acme": "sk-acme-bench-stall-exit-0000000000", "admin": "sk-admin-bench-stall-exit-00000000"}


def settings(m1: str, m2: str, redis_url: str, *, redis_timeout_s: float, server: dict[str, Any],
             tpm: int | None = None) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", "log_requests": False, **server},
        "models": [{"name": "m1", "endpoints": [m1]}, {"name": "m2", "endpoints": [m2]}],
        "redis_url": redis_url,
        "tenancy": {"admin_key_hashes": [hash_key(KEYS["admin"])], "prices": {"m1": PRICE, "m2": PRICE},
                    "redis_timeout_s": redis_timeout_s,
                    "tenants": [{"id": "acme", "key_hashes": [hash_key(KEYS["acme"])], "daily_budget_usd": "100",
                                 "tpm": tpm}]},
    })


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}


def body(model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": "one two three"}]}


async def read_stream(client: httpx.AsyncClient, url: str, b: dict[str, Any]) -> int:
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=b, headers=auth("acme")) as r:
            await r.aread()
            return r.status_code
    except httpx.TransportError:
        return -1


async def wait_for(predicate: Any, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


def reported_tokens(stderr: str) -> tuple[int, int]:
    """(lines, tokens) of the exit log's `usage not written` lines (JSON log lines)."""
    lines = tokens = 0
    for line in stderr.splitlines():
        if "usage not written" not in line:
            continue
        lines += 1
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        tokens += int(rec.get("prompt_tokens", 0)) + int(rec.get("completion_tokens", 0))
    return lines, tokens


async def one(n: int, args: argparse.Namespace, server: dict[str, Any]) -> dict[str, Any]:
    fine = await FakeEngine(FakeEngineConfig(model="m1")).start()
    stuck = await FakeEngine(FakeEngineConfig(model="m2", hang_after_chunks=3)).start()
    tmp = Path(tempfile.mkdtemp(prefix="fg-stall-exit-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    killed = False
    try:
        with LocalRedis() as redis:
            assert redis.pid is not None
            config = settings(fine.url, stuck.url, redis.url, redis_timeout_s=args.redis_timeout,
                              server={"drain_s": args.drain, "drain_close_s": args.close, **server}, tpm=args.tpm)
            path = tmp / "gateway.yaml"
            path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
            errlog = (tmp / "stderr.log").open("wb")
            proc = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is timed)
                [args.python, "-m", "fleetgate", "gateway", "--config", str(path), "--port", str(port),
                 "--metrics-port", "0"],
                env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL, stderr=errlog)
            limits = httpx.Limits(max_connections=n + 8)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                try:
                    for _ in range(600):
                        try:
                            if (await client.get(url + "/healthz")).status_code == 200:
                                break
                        except httpx.TransportError:
                            await asyncio.sleep(0.05)
                    assert await read_stream(client, url, body("m1", 5)) == 200
                    held = [asyncio.ensure_future(read_stream(client, url, body("m2", 50))) for _ in range(n)]
                    assert await wait_for(lambda: stuck.stats.completion_tokens == 3 * n, 30), "streams not open"
                    os.kill(redis.pid, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(0.5)
                        proc.send_signal(signal.SIGTERM)
                        sent = time.monotonic()
                        try:
                            await asyncio.to_thread(proc.wait, args.exit_limit)
                        except subprocess.TimeoutExpired:
                            killed = True
                        took = time.monotonic() - sent
                    finally:
                        os.kill(redis.pid, signal.SIGCONT)
                    await asyncio.gather(*held)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
            errlog.close()
            stderr = (tmp / "stderr.log").read_text()
            await asyncio.sleep(1.0)  # what Redis still had in its sockets is applied once it runs again
            reader_settings = settings(fine.url, stuck.url, redis.url, redis_timeout_s=2.0, server={}, tpm=args.tpm)
            reader = build_server(reader_settings, port=free_port(), metrics_port=None)
            task = await start_in_background(reader)
            reader_url = f"http://127.0.0.1:{reader.config.port}"
            async with httpx.AsyncClient(base_url=reader_url, timeout=10) as c:
                totals = (await c.get("/v1/usage", headers=auth("admin"))).json()["totals"]
                budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
            reader.should_exit = True
            await task
    finally:
        await fine.stop()
        await stuck.stop()
    rates = list_rates(ListPrice.model_validate(PRICE))
    owed_tokens = sum(e.stats.prompt_tokens + e.stats.completion_tokens for e in (fine, stuck))
    owed_micros = cost_micros(Usage(prompt_tokens=fine.stats.prompt_tokens + stuck.stats.prompt_tokens,
                                    completion_tokens=fine.stats.completion_tokens + stuck.stats.completion_tokens),
                              rates)
    lines, rep = reported_tokens(stderr)
    return {
        "streams": n, "exit_s": round(took, 2), "killed_at_limit": killed, "rc": proc.returncode,
        "owed_requests": 1 + n, "ledger_requests": totals.get("requests", 0),
        "owed_tokens": owed_tokens,
        "ledger_tokens": totals.get("prompt_tokens", 0) + totals.get("completion_tokens", 0),
        "owed_micros": owed_micros, "ledger_micros": totals.get("cost_micros", 0),
        "tpm_used": budgets["data"][0]["windows"].get("tpm", {}).get("used"),
        "counter_micros": budgets["data"][0]["windows"]["daily_budget"]["used"],
        "reported_lines": lines, "reported_tokens": rep,
        "shutdown_complete": "Application shutdown complete" in stderr,
        "traceback": "Traceback" in stderr,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, action="append", help="open streams (repeat; default 1, 8, 64)")
    parser.add_argument("--python", default=sys.executable, help="the python whose fleetgate gateway runs")
    parser.add_argument("--redis-timeout", type=float, default=2.0, help="tenancy.redis_timeout_s (default 2)")
    parser.add_argument("--drain", type=float, default=1.0, help="server.drain_s")
    parser.add_argument("--close", type=float, default=1.0, help="server.drain_close_s")
    parser.add_argument("--tpm", type=int, help="the tenant's tokens-per-minute limit (default none: budget only)")
    parser.add_argument("--exit-limit", type=float, default=60.0, help="kill a gateway not gone by then (s)")
    parser.add_argument("--server", action="append", default=[], help="more server settings, KEY=VALUE (YAML value)")
    args = parser.parse_args()
    server = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.server)}
    for n in args.streams or [1, 8, 64]:
        row = await one(n, args, server)
        row["exit_after_drain_s"] = round(row["exit_s"] - args.drain - args.close, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
