"""Run `fleetgate gateway` with its event loop watched (`fleetgate/bench/loop_watch.py`, every `--every-ms`): how
late the loop runs a timer (about what a request arriving then waits before its first callback runs) and the
cyclic GC's pauses. Written for `scripts/bench_stream_cpu.py --loop-probe`; a file run by each checkout's own
python, so it imports from the gateway only what every checkout has (`build_server`) and loads the watch from this
checkout by path. `--reuse-port`: several of these processes serve one port (`bench_stream_cpu.py --procs N`).

    python scripts/gateway_loop_probe.py --config gateway.yaml --out stats.json

The watch starts once the server listens and stops when SIGTERM starts the drain; its summary goes to `--out`
as JSON. `GATEWAY_PROBE_GC_THRESHOLD=A,B,C` (or `--gc-threshold`) sets other GC thresholds once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

from fleetgate.core.config import load_model
from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings


async def start_in_background(server: Any, *, sockets: list[socket.socket] | None) -> asyncio.Task[None]:
    """`server.serve(sockets)` as a task, returned once it listens."""
    task: asyncio.Task[None] = asyncio.create_task(server.serve(sockets=sockets))
    for _ in range(6000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        task.result()
        raise RuntimeError("the gateway did not start")
    return task


def loop_watch_module() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "fleetgate" / "bench" / "loop_watch.py"
    spec = importlib.util.spec_from_file_location("loop_watch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes bind too (SO_REUSEPORT: the kernel spreads connections)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every-ms", type=float, default=1.0)
    parser.add_argument("--gc-threshold", default=os.environ.get("GATEWAY_PROBE_GC_THRESHOLD", ""),
                        help="A,B,C for gc.set_threshold once serving (default: the gateway's own)")
    parser.add_argument("--reuse-port", action="store_true",
                        help="bind with SO_REUSEPORT (several processes share the port; each its own metrics port)")
    args = parser.parse_args()
    lw = loop_watch_module()
    settings = load_model(GatewaySettings, args.config)
    server = build_server(settings, freeze_heap=True, metrics_port=0 if args.reuse_port else None)
    sockets = [shared_socket(settings.server.host, settings.server.port)] if args.reuse_port else None
    watch = lw.LoopWatch(args.every_ms / 1000)
    shutdown = server.shutdown

    async def shutdown_then_report(sockets: Any = None) -> None:
        # here rather than after `serve()`: uvicorn re-raises the SIGTERM it caught once `serve()` ends
        watch.stop()
        await shutdown(sockets=sockets)
        args.out.write_text(json.dumps(lw.summary({"every_s": watch.every_s, "samples": watch.samples,
                                                    "pauses": watch.pauses})))

    server.shutdown = shutdown_then_report  # type: ignore[method-assign]

    async def serve() -> None:
        # start-up (the heap freeze) is not serving: not watched
        task = await start_in_background(server, sockets=sockets)
        if args.gc_threshold:  # an experiment's thresholds, set once the heap is frozen
            gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
        watch.start()
        await task

    import uvloop

    uvloop.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
