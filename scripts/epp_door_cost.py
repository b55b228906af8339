"""What one prefix-hit stream pays at each door: Envoy alone, FleetGate's gateway, Envoy + a null picker, Envoy + EPP.

`python scripts/epp_door_cost.py [--requests 40] [--time-scale 0.1]` (docs/reports/epp.md, second session).
One simulated vLLM CPU engine in this process; every door its own process, as deployed. One prompt with a
~1,000-token shared prefix (every request after the warm-up is a prefix hit), streamed `/v1/completions` of
8 tokens, the doors alternating request by request; prints TTFT p50/p90 at the client per door and each door's
TTFT p50 over Envoy alone. The null picker (`--null-picker PORT DEST`, this file run as a server) answers the
ext_proc messages the way FleetGate's picker does (a fixed pick once the body is in, both bodies passed through)
and does nothing else: TTFT through it over Envoy alone is the protocol's own cost; through the EPP over it,
FleetGate's work in the picker. Bounded: every process it starts is stopped at the end.
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
from typing import Any

import aiohttp
import orjson
import yaml


async def _null_picker(port: int, dest: str) -> None:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
    from grpc_health.v1 import _async as health_async
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from fleetgate.gateway.epp import messages as m

    class Null(ext_proc_grpc.ExternalProcessorServicer):
        async def Process(self, requests: Any, context: Any) -> None:
            body: list[bytes] = []
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    return
                kind = req.WhichOneof("request")
                out: list[Any] = []
                if kind == "request_body":
                    body.append(req.request_body.body)
                    if req.request_body.end_of_stream:
                        raw = b"".join(body)
                        out = [m.route_to([dest], set_headers={"content-length": str(len(raw))}, remove=()),
                               *m.body_pieces(raw, response=False)]
                elif kind == "response_headers":
                    out = [m.response_headers(set_headers={})]
                elif kind == "response_body":
                    out = m.body_pieces(req.response_body.body, response=True, end=req.response_body.end_of_stream)
                for resp in out:
                    await context.write(resp)
                if kind == "response_body" and req.response_body.end_of_stream:
                    return

    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Null(), server)
    health = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for name in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination(timeout=3600)


def _start(tmp: str, settings: dict[str, Any], *, gateway: int, epp: int, null: int,
           dest: str) -> list[subprocess.Popen[bytes]]:
    """The gateway, FleetGate's picker and the null picker, each its own process."""
    config = os.path.join(tmp, "gateway.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(settings, f)
    cli = [sys.executable, "-m", "fleetgate"]
    argvs = [[*cli, "gateway", "--config", config, "--port", str(gateway)],
             [*cli, "epp", "--config", config, "--port", str(epp)],
             [sys.executable, __file__, "--null-picker", str(null), dest]]
    return [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for argv in argvs]


async def _ttft(session: aiohttp.ClientSession, url: str, model: str, prompt: str) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first: float | None = None
    async with session.post(f"{url}/v1/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        async for raw in resp.content:
            if first is None and raw.startswith(b"data: {") and b'"choices":[{' in raw:
                first = time.perf_counter()
    if resp.status != 200 or first is None:
        raise RuntimeError(f"{url} answered {resp.status} without a first token")
    return (first - start) * 1e3


async def measure(args: argparse.Namespace) -> None:
    from fleetgate.bench.envoy import EnvoyProcess
    from fleetgate.bench.envoy_phase import plain_proxy_config
    from fleetgate.bench.prefix_doors import _ready, _settings
    from fleetgate.core.localredis import free_port
    from fleetgate.gateway.epp.envoyconfig import envoy_config
    from fleetgate.sim.fleet import start_sim_fleet
    from fleetgate.sim.profile import get_profile

    profile = get_profile("vllm-cpu-gemma3-270m").with_(time_scale=args.time_scale, num_blocks=256)
    async with await start_sim_fleet(replicas=1, profile=profile) as fleet:
        engine = ("127.0.0.1", int(fleet.urls[0].rsplit(":", 1)[1]))
        gateway, epp, null = free_port(), free_port(), free_port()
        with tempfile.TemporaryDirectory() as tmp:
            settings = _settings(fleet.model, fleet.urls, "default").model_dump(mode="json", by_alias=True)
            procs = await asyncio.to_thread(_start, tmp, settings, gateway=gateway, epp=epp, null=null,
                                            dest=f"{engine[0]}:{engine[1]}")
            envoys: list[EnvoyProcess] = []
            try:
                await asyncio.sleep(args.startup_s)  # the pickers listen before Envoy's first health check
                ports = {name: free_port() for name in ("envoy alone", "envoy + null picker", "envoy + EPP")}
                envoys = [EnvoyProcess(plain_proxy_config(listen=ports["envoy alone"], upstream=engine))] + [
                    EnvoyProcess(envoy_config(listen=("127.0.0.1", ports[name]), epp=("127.0.0.1", picker),
                                              pool=[engine], health_interval_s=0.2))
                    for name, picker in (("envoy + null picker", null), ("envoy + EPP", epp))]
                for envoy in envoys:
                    await asyncio.to_thread(envoy.__enter__)
                doors = {"envoy alone": ports["envoy alone"], "gateway": gateway,
                         "envoy + null picker": ports["envoy + null picker"], "envoy + EPP": ports["envoy + EPP"]}
                urls = {name: f"http://127.0.0.1:{port}" for name, port in doors.items()}
                ttfts: dict[str, list[float]] = {name: [] for name in urls}
                prefix = "shared system prompt words " * 200
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                    for url in urls.values():
                        await _ready(session, url, fleet.model)
                    for i in range(args.requests + 3):
                        for name, url in urls.items():
                            value = await _ttft(session, url, fleet.model, f"{prefix} question {i % 3}")
                            if i >= 3:  # the first three: the prefix's first visit and warm connections
                                ttfts[name].append(value)
            finally:
                for envoy in envoys:
                    await asyncio.to_thread(envoy.__exit__, None, None, None)
                for proc in procs:
                    proc.terminate()
                    await asyncio.to_thread(proc.wait, 30)
    base = statistics.median(ttfts["envoy alone"])
    print(f"prefix-hit TTFT per door ({args.requests} requests each, time scale {args.time_scale}, "
          f"load average {os.getloadavg()[0]:.1f})")
    for name, values in ttfts.items():
        p50 = statistics.median(values)
        p90 = sorted(values)[int(len(values) * 0.9)]
        print(f"  {name:<20} p50 {p50:7.2f} ms  p90 {p90:7.2f} ms  over Envoy alone {p50 - base:+6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--startup-s", type=float, default=8.0, help="wait for the gateway and pickers to start")
    parser.add_argument("--null-picker", nargs=2, metavar=("PORT", "DEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    if args.null_picker:
        uvloop.run(_null_picker(int(args.null_picker[0]), args.null_picker[1]))
    else:
        uvloop.run(measure(args))


if __name__ == "__main__":
    main()
