"""The gateway's CPU per request on the paths whose own time (`own_time`, `epp.metrics`) is measured, for two
checkouts side by side: this worktree (`new`) and a base commit (`base`, extracted with `git archive` to a
temporary folder and imported ahead of the editable install), so a ratio new/base is measured in one run.

Per round, one worker process per checkout, in alternating order (a drift of the shared box falls on both). A
worker runs the fake engine (`fleetgate.sim.fake_engine`) in a thread of its own, drives the gateway's ASGI app
directly in its main thread (no uvicorn, no HTTP client: what is measured is the app's work), one request at a
time, and reports the main thread's CPU time (`time.thread_time`) per request, per case: chat streamed (a
reference whose code did not change), Responses and Messages streamed and not, and the Endpoint Picker's
exchange for a streamed chat request (ext_proc messages fed to `Exchange`, no gRPC).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_own_time_cpu.py --base 5f69ff8 --rounds 5 --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("gateway", "router", "cache", "operator", "engine_image")  # `setup.py`'s roots below `fleetgate`
CASES = ("chat_stream", "responses_stream", "responses_plain", "messages_stream", "messages_plain", "epp_stream")


def extract(commit: str, into: Path) -> Path:
    """The commit's tree under `into/tree`, and an import root `into/src` whose `fleetgate` maps its folders."""
    tar = into / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(tar), commit], check=True)
    tree = into / "tree"
    with tarfile.open(tar) as archive:
        archive.extractall(tree, filter="data")
    src = into / "src"
    src.mkdir()
    (src / "fleetgate").symlink_to(tree / "fleetgate")
    for name in MAPPED:
        link = tree / "fleetgate" / name
        if not link.exists():
            link.symlink_to(tree / name)
    return src


# ---- the worker ---------------------------------------------------------------------------------------------

def bodies(case: str, i: int) -> tuple[str, bytes]:
    text = f"tell me about the number {i} and what follows it"
    stream = case.endswith("_stream")
    if case.startswith("responses"):
        body: dict[str, Any] = {"model": "m1", "input": text, "max_output_tokens": 16, "stream": stream}
        return "/v1/responses", json.dumps(body).encode()
    if case.startswith("messages"):
        body = {"model": "m1", "max_tokens": 16, "messages": [{"role": "user", "content": text}], "stream": stream}
        return "/v1/messages", json.dumps(body).encode()
    body = {"model": "m1", "max_tokens": 16, "messages": [{"role": "user", "content": text}], "stream": stream,
            "temperature": 0.8}
    return "/v1/chat/completions", json.dumps(body).encode()


async def asgi_post(app: Any, path: str, body: bytes) -> int:
    """One POST through the app; its status (the body is checked to have been sent whole)."""
    first = True
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays: the app's watch is cancelled when the request ends
        return {"type": "http.disconnect"}

    status = 0
    ended = False

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, ended
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            ended = True

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
             "root_path": ""}
    await app(scope, receive, send)
    assert ended, path
    return status


def start_engine() -> str:
    from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

    ready: queue.Queue[str] = queue.Queue()

    def run() -> None:
        loop = asyncio.new_event_loop()
        engine = loop.run_until_complete(FakeEngine(FakeEngineConfig(model="m1")).start())
        ready.put(engine.url)
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    return ready.get(timeout=30)


async def epp_requests(count: int, engine_url: str) -> float:
    """CPU per streamed chat request through the picker's exchange (seconds)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from prometheus_client import CollectorRegistry

    from fleetgate.gateway.epp.exchange import Exchange
    from fleetgate.gateway.epp.server import build_epp
    from fleetgate.gateway.settings import GatewaySettings

    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False}, "cache": {"enabled": False},
        "models": [{"name": "m1", "endpoints": [engine_url]}]})
    epp = build_epp(settings, port=0, metrics_port=None, registry=CollectorRegistry())

    def hmap(values: dict[str, str]) -> Any:
        return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                           for k, v in values.items()])

    req_headers = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hmap(
        {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"})))
    resp_headers = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hmap(
        {":status": "200", "content-type": "text/event-stream"})))
    chunks = []
    for n in range(16):
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m1",
                 "choices": [{"index": 0, "delta": {"content": f"t{n} "}, "finish_reason": None}],
                 "usage": {"prompt_tokens": 9, "completion_tokens": n + 1, "total_tokens": n + 10}}
        chunks.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: " + json.dumps(chunk).encode()
                                                                      + b"\n\n")))
    chunks.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)))

    async def one(i: int) -> None:
        exchange = Exchange(epp.door)
        await exchange.on_message(req_headers)
        _, raw = bodies("chat_stream", i)
        await exchange.on_message(pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)))
        await exchange.on_message(resp_headers)
        for c in chunks:
            await exchange.on_message(c)
        assert exchange.done
        exchange.close()

    for i in range(50):
        await one(i)
    await epp.pipeline.drain()
    t0 = time.thread_time()
    for i in range(count):
        await one(i)
    took = time.thread_time() - t0
    await epp.pipeline.drain()
    return took / count


async def worker(count: int) -> dict[str, float]:
    from fleetgate.gateway import event_relay
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.settings import GatewaySettings

    print(f"fleetgate.gateway from {os.path.dirname(event_relay.__file__)}", file=sys.stderr)
    engine_url = start_engine()
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False}, "cache": {"enabled": False},
        "models": [{"name": "m1", "endpoints": [engine_url]}]})
    app = create_app(settings)
    out: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        for case in CASES[:-1]:
            for i in range(50):
                assert await asgi_post(app, *bodies(case, i)) == 200, case
            t0 = time.thread_time()
            for i in range(count):
                assert await asgi_post(app, *bodies(case, i)) == 200, case
            out[case] = (time.thread_time() - t0) / count
    out["epp_stream"] = await epp_requests(count, engine_url)
    return out


# ---- the driver ---------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the base commit (git rev)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="measured requests per case and worker")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(worker(args.requests))))
        return 0
    results: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="owntime-base-") as tmp:
        base_src = extract(args.base, Path(tmp))
        envs = {"base": {**os.environ, "PYTHONPATH": str(base_src), "PYTHONSAFEPATH": "1"},
                "new": {**os.environ, "PYTHONSAFEPATH": "1"}}
        for r in range(args.rounds):
            for name in (("base", "new") if r % 2 == 0 else ("new", "base")):
                done = subprocess.run([sys.executable, __file__, "--worker", "--requests", str(args.requests)],
                                      env=envs[name], capture_output=True, text=True, timeout=600)
                if done.returncode:
                    print(done.stderr, file=sys.stderr)
                    return 1
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {r} {name}: " + done.stderr.strip().splitlines()[0], file=sys.stderr)
    print(f"base {args.base}, {args.rounds} rounds x {args.requests} requests a case; CPU us/request of the "
          "gateway's thread: median over rounds (min-max), ratio new/base of the medians")
    print(f"{'case':<18} {'base':>20} {'new':>20} {'new/base':>9} {'min new/min base':>17}")
    for case in CASES:
        b = [row[case] * 1e6 for row in results["base"]]
        n = [row[case] * 1e6 for row in results["new"]]
        mb, mn = statistics.median(b), statistics.median(n)
        print(f"{case:<18} {mb:8.1f} ({min(b):5.0f}-{max(b):5.0f}) {mn:8.1f} ({min(n):5.0f}-{max(n):5.0f}) "
              f"{mn / mb:9.3f} {min(n) / min(b):17.3f}")
    added()
    return 0


def added() -> None:
    """The work this change put on each request, alone, against an empty loop of the same length (both in this
    process, interleaved): the HTTP door's `first_chunk` observation (two clock reads, two observations) and the
    picker's three phases (four more clock reads than its decision interval's two, three observations)."""
    from time import perf_counter_ns
    from timeit import repeat

    from prometheus_client import CollectorRegistry, Histogram

    from fleetgate.gateway.epp.metrics import EppOwnTime
    from fleetgate.gateway.own_time import OWN_BUCKETS, OwnTime

    registry = CollectorRegistry()
    own = OwnTime(Histogram("own", "", ["phase"], buckets=OWN_BUCKETS, registry=registry))
    epp = EppOwnTime(Histogram("epp", "", ["phase"], buckets=OWN_BUCKETS, registry=registry))
    scope = {"own": own, "epp": epp, "now": perf_counter_ns}
    stmts = {
        "empty": "pass",
        "http door: first_chunk": "r = now(); own.first_chunk(r, 120_000)",
        "picker: 3 phases": "a = now(); b = now(); t = epp.routed(b - a, 90_000); e = now(); "
                            "epp.first_chunk(now() - e, t)",
    }
    number = 100_000
    best = {name: min(repeat(stmt, globals=scope, number=number, repeat=7)) / number * 1e6
            for name, stmt in stmts.items()}
    print("\nthe added work alone, us per request (best of 7 x 100,000, minus the empty loop's "
          f"{best['empty']:.3f} us):")
    for name in list(stmts)[1:]:
        print(f"  {name:<24} {best[name] - best['empty']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
