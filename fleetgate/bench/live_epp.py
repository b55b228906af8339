"""Issue 27 on live engines: FleetGate's router as an Endpoint Picker behind a real Envoy, against the gateway.

The live routing benchmark's `envoy+epp` door (`PointSpec.door`): a `fleetgate epp` process with exactly the
gateway's settings for the point's profile (`live_gateway.gateway_settings`: the same tenants, keys, routes and
routing) plus its gRPC address, and a real Envoy (`fleetgate.bench.envoy`) running the `fleetgate epp
--envoy-config` bootstrap (`gateway.epp.envoyconfig`) over the same engines. A `door` point runs the same
requests (same seed) through the gateway and through this door, so the prefix-routing gain (default over
least-loaded) of each door comes out of one run. The picker serves no usage API, so its points stay out of the
accounting check (`run_point` leaves their `lost_*` figures out).

The door-latency phase (`run_door_latency`): the gateway, Envoy + EPP and Envoy alone (one static cluster of the
engines, round-robin; a probe pins its engine with `PIN_HEADER`) run at once; each round sends the same-shaped
cached probe (`live_overhead.Prober`) straight to engine k and through each door to engine k (the picker and the
gateway route model `probe-<k>` to engine k alone), one after the other on idle engines, all at once while
Envoy + EPP relays a background load (the shared-prefix workload at the point's rate). Added TTFT per round:
each door minus direct, and Envoy + EPP minus Envoy alone (issue 27's target: <= 2 ms p50), p50/p90 and the
mean with its 95% interval. The picker's and both Envoys' CPU per request over the loaded window.

The picker's process may get a site directory first on its path (`LiveContext.epp_site`: on the GPU machine,
the gRPC packages of `scripts/gpu/pack_epp.py`), so the engines keep the machine's own packages.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetgate.bench import live_engines
from fleetgate.bench.envoy import EnvoyProcess
from fleetgate.bench.envoy_phase import PIN_HEADER, plain_proxy_config
from fleetgate.bench.live_client import LiveRequest, LiveResult, LoopLag, completion_body, replay, stream_one
from fleetgate.bench.live_gateway import GatewayProcess, Keys, Profile, gateway_settings, http_ok, start_gateway
from fleetgate.bench.live_overhead import Prober, mean_ci
from fleetgate.bench.live_points import LiveContext, PointSpec, build_requests
from fleetgate.core.errors import ConfigError
from fleetgate.core.localredis import free_port
from fleetgate.sim.report import quantile

EPP = "envoy+epp"
ALONE = "envoy alone"
GATEWAY = "gateway"
DIRECT = "direct"


@dataclass
class EppDoor:
    """Envoy in front of a `fleetgate epp` process: the point's front door (`live_points.Door`)."""

    profile: str
    url: str  # Envoy's listener
    picker: GatewayProcess  # the picker's process (its `url` is its metrics listener)
    envoy: EnvoyProcess
    started_s: float = 0.0

    def cpu_s(self) -> float:
        """Envoy's and the picker's CPU seconds: what the door costs, as the gateway's process does."""
        return self.envoy.cpu_s() + self.picker.cpu_s()

    def stop(self) -> None:
        # Envoy's log lives in its own temporary folder: its tail goes beside the picker's log (a GPU run's
        # `gateways.log` collects both)
        tail = self.envoy.log_tail()
        self.envoy.__exit__(None, None, None)
        self.picker.stop()
        self.picker.log_path.with_name(self.picker.log_path.stem + "-envoy.log").write_text(tail or "(empty)\n")


def picker_env(epp_site: str) -> dict[str, str]:
    """The picker's environment: `epp_site` first on its path, when given."""
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1"}
    if epp_site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (epp_site, os.environ.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True)
class PickerSpec:
    """What a picker serves: the live gateway's settings for these engines and tenants."""

    model: str
    urls: list[str]
    keys: Keys
    workdir: Path
    kv_events: list[dict[str, Any]]
    epp_site: str = ""

    @classmethod
    def of(cls, ctx: LiveContext) -> PickerSpec:
        return cls(model=ctx.model, urls=ctx.urls, keys=ctx.keys, workdir=ctx.workdir, kv_events=ctx.kv_events,
                   epp_site=ctx.epp_site)


def picker_settings(spec: PickerSpec, profile: Profile, *, grpc_port: int, metrics_port: int) -> dict[str, Any]:
    """The gateway's settings for `profile` (`gateway_settings`), with the picker's gRPC address."""
    if profile.routing is None:
        raise ConfigError(f"profile {profile.name} has no Endpoint Picker form (the picker runs routing profiles)")
    settings = gateway_settings(port=free_port(), metrics_port=metrics_port, model=spec.model, urls=spec.urls,
                                keys=spec.keys, routing=profile.routing, kv_events=spec.kv_events)
    settings["epp"] = {"host": "127.0.0.1", "port": grpc_port}
    # `fleetgate epp` configures logging at `server.log_level` (info: a JSON usage line per request); the benchmark's
    # gateway child configures none, so it logs warnings alone: the picker does the same, for the same work
    settings["server"]["log_level"] = "warning"
    return settings


def start_picker(spec: PickerSpec, profile: Profile, *, grpc_port: int, timeout_s: float = 60.0) -> GatewayProcess:
    """`python -m fleetgate epp --config ...` for `profile`, once its metrics listener answers (Envoy's gRPC health
    check tells when its stages are ready)."""
    import subprocess

    import yaml

    metrics_port = free_port()
    settings = picker_settings(spec, profile, grpc_port=grpc_port, metrics_port=metrics_port)
    stem = spec.workdir / f"gateway-epp-{profile.name}-{grpc_port}"
    config = stem.with_suffix(".yaml")
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    log_path = stem.with_suffix(".log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        popen = subprocess.Popen([sys.executable, "-m", "fleetgate", "epp", "--config", str(config)],
                                 env=picker_env(spec.epp_site), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT)
    metrics = f"http://127.0.0.1:{metrics_port}"
    proc = GatewayProcess(profile=f"epp {profile.name}", popen=popen, url=metrics, metrics_url=metrics + "/metrics",
                          log_path=log_path)
    while not http_ok(proc.metrics_url):
        if popen.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.stop()
            raise RuntimeError(f"the Endpoint Picker for {profile.name} did not start:\n"
                               f"{log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    proc.started_s = time.monotonic() - t0
    return proc


def _hosts(urls: list[str]) -> list[tuple[str, int]]:
    return [(u.split("//", 1)[1].rsplit(":", 1)[0], int(u.rsplit(":", 1)[1])) for u in urls]


async def answering(ctx: LiveContext, url: str, *, model: str, headers: dict[str, str], timeout_s: float = 20.0
                    ) -> None:
    """Until a one-token completion through `url` answers 200 (Envoy marks the picker healthy after its first
    health check; until then it answers 503)."""
    deadline = time.monotonic() + timeout_s
    body = completion_body(model=model, prompt="warm", max_tokens=1, include_usage=False)
    while True:
        req = LiveRequest(id="ready", url=url, body=body, headers={"Content-Type": "application/json", **headers},
                          at_s=0)
        out = LiveResult(id=req.id, path=req.path, tenant="", group="", sent_s=0.0)
        await stream_one(ctx.session, req, out, t0=time.perf_counter())
        if out.status == 200 and out.error is None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {timeout_s:g}s: {out.status} {out.error}")
        await asyncio.sleep(0.1)


async def start_epp_door(ctx: LiveContext, profile: Profile) -> EppDoor:
    """The picker for `profile` and an Envoy asking it, answering requests."""
    t0 = time.monotonic()
    grpc_port = free_port()
    picker = await asyncio.to_thread(start_picker, PickerSpec.of(ctx), profile, grpc_port=grpc_port)
    listen = free_port()
    from fleetgate.gateway.epp.envoyconfig import envoy_config

    try:
        envoy = EnvoyProcess(envoy_config(listen=("127.0.0.1", listen), epp=("127.0.0.1", grpc_port),
                                          pool=_hosts(ctx.urls), health_interval_s=0.5))
        await asyncio.to_thread(envoy.__enter__)
    except BaseException:
        picker.stop()
        raise
    door = EppDoor(profile=profile.name, url=f"http://127.0.0.1:{listen}", picker=picker, envoy=envoy)
    try:
        tenant = next(iter(ctx.keys.tenants.values()))
        await answering(ctx, door.url, model=ctx.model, headers={"Authorization": f"Bearer {tenant}"})
    except BaseException:
        door.stop()
        raise
    door.started_s = time.monotonic() - t0
    return door


class DoorProber(Prober):
    """The paired probe of `live_overhead`, to engine k straight and through each door (`doors`: name -> URL)."""

    def __init__(self, ctx: LiveContext, doors: dict[str, str]) -> None:
        super().__init__(ctx, doors[GATEWAY])
        self.doors = doors

    def door_request(self, *, engine: int, door: str) -> LiveRequest:
        if door == DIRECT:
            return self._request(engine=engine, via_gateway=False)
        if door == ALONE:  # the engine's own model name; Envoy picks the engine by the pin header
            req = self._request(engine=engine, via_gateway=False)
            return replace(req, url=self.doors[door], path=door, headers={**req.headers, PIN_HEADER: str(engine)})
        req = self._request(engine=engine, via_gateway=True)  # model probe-<k>: engine k alone
        return replace(req, url=self.doors[door], path=door)

    async def rounds(self, *, count: int | None = None, until: float | None = None, at_once: bool = True
                     ) -> list[dict[str, float]]:
        """TTFT (s) of each way per round, to one engine (the engines in turn); the way that goes first rotates.
        At once under load, one after the other when idle (`Prober.pairs` says why)."""
        ways = [DIRECT, *self.doors]
        out: list[dict[str, float]] = []
        i = 0
        while (count is None or i < count) and (until is None or time.perf_counter() < until):
            shift = i % len(ways)
            reqs = [self.door_request(engine=i % len(self.ctx.urls), door=w) for w in ways[shift:] + ways[:shift]]
            if at_once:
                results = list(await asyncio.gather(*(self.one(r) for r in reqs)))
            else:
                results = [await self.one(r) for r in reqs]
            ttfts = {r.path: r.ttft_s for r in results if r.error is None and r.ttft_s is not None}
            if len(ttfts) == len(ways):
                out.append({k: float(v) for k, v in ttfts.items() if v is not None})
            i += 1
        return out


def added(rounds: list[dict[str, float]], way: str, base: str) -> dict[str, Any]:
    """TTFT of `way` minus `base` per round (ms): p50, p90, mean with its bootstrap 95% interval, count."""
    diffs = [r[way] - r[base] for r in rounds if way in r and base in r]
    if not diffs:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "mean_ms": None}
    mean = mean_ci(diffs)
    return {"n": len(diffs), "p50_ms": round(quantile(diffs, 0.5) * 1000, 3),
            "p90_ms": round(quantile(diffs, 0.9) * 1000, 3), "mean_ms": [round(v * 1000, 3) for v in mean]}


COMPARISONS = ((EPP, ALONE), (EPP, DIRECT), (ALONE, DIRECT), (GATEWAY, DIRECT), (EPP, GATEWAY))


def figures(rounds: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Every comparison of `COMPARISONS`, keyed `way - base`."""
    return {f"{way} - {base}": added(rounds, way, base) for way, base in COMPARISONS}


async def run_door_latency(ctx: LiveContext, spec: PointSpec, *, idle_rounds: int) -> dict[str, Any]:
    """The door-latency phase (module docstring); `spec` gives the profile, the background's rate, window and
    seed."""
    session, urls = ctx.session, ctx.urls
    await live_engines.wait_idle(session, urls, timeout_s=30)
    if ctx.resets:
        await live_engines.reset_prefix_caches(session, urls)
    profile = ctx.profiles[spec.profile]
    gateway = await asyncio.to_thread(start_gateway, profile, model=ctx.model, urls=urls, keys=ctx.keys,
                                      workdir=ctx.workdir, kv_events=ctx.kv_events)
    stops: list[Any] = [gateway.stop]
    try:
        epp = await start_epp_door(ctx, profile)
        stops.append(epp.stop)
        hosts = _hosts(urls)
        alone_port = free_port()
        alone = EnvoyProcess(plain_proxy_config(listen=alone_port, upstream=hosts[0], more=hosts[1:]))
        await asyncio.to_thread(alone.__enter__)
        stops.append(lambda: alone.__exit__(None, None, None))
        prober = DoorProber(ctx, {ALONE: f"http://127.0.0.1:{alone_port}", EPP: epp.url, GATEWAY: gateway.url})
        await prober.warm()
        await prober.rounds(count=len(urls), at_once=False)  # every door's connections open, caches warm
        idle = await prober.rounds(count=idle_rounds, at_once=False)
        background = build_requests(ctx, spec, epp.url)
        cpu0 = (epp.picker.cpu_s(), epp.envoy.cpu_s(), alone.cpu_s(), gateway.cpu_s())
        probes0 = prober.n
        lag = LoopLag()
        lag.start()
        t0 = time.perf_counter()
        load_task = asyncio.create_task(replay(session, background, drain_deadline_s=spec.window_s + spec.drain_s,
                                               send_until_s=spec.window_s))
        loaded = await prober.rounds(until=t0 + spec.window_s)
        cpu1 = (epp.picker.cpu_s(), epp.envoy.cpu_s(), alone.cpu_s(), gateway.cpu_s())
        elapsed = time.perf_counter() - t0
        results, _ = await load_task
        await lag.stop()
    finally:
        for stop in reversed(stops):
            await asyncio.to_thread(stop)
    probes = (prober.n - probes0) // (len(prober.doors) + 1)  # probes per way in the loaded window
    ok = [r.ttft_s for r in results if r.ttft_s is not None and r.error is None]
    sent = sum(1 for r in results if r.sent_s <= elapsed)
    picker_cpu, envoy_cpu, alone_cpu, gateway_cpu = (b - a for a, b in zip(cpu0, cpu1, strict=True))
    return {
        "kind": "door-latency", "profile": spec.profile, "load": spec.load, "rate": spec.rate,
        "window_s": spec.window_s, "seed": spec.seed,
        "idle_rounds": len(idle), "idle": figures(idle), "loaded_rounds": len(loaded), "loaded": figures(loaded),
        "background_requests": len(results), "background_errors": sum(1 for r in results if r.error),
        "background_ttft_p50_s": quantile(ok, 0.5) if ok else None,
        "background_ttft_p90_s": quantile(ok, 0.9) if ok else None,
        # CPU per request in the loaded window: Envoy + EPP relayed the background and its probes, the others
        # their probes alone
        "picker_cpu_ms_per_request": 1000 * picker_cpu / max(1, sent + probes),
        "epp_envoy_cpu_ms_per_request": 1000 * envoy_cpu / max(1, sent + probes),
        "alone_envoy_cpu_ms_per_request": 1000 * alone_cpu / max(1, probes),
        "gateway_cpu_ms_per_request": 1000 * gateway_cpu / max(1, probes),
        "client_loop_lag_p99_s": lag.p99(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
    }


def door_line(row: dict[str, Any]) -> str:
    """One log line for a door-latency row."""
    def f(fig: dict[str, Any]) -> str:
        return "-" if not fig.get("n") else f"p50 {fig['p50_ms']:+.2f} p90 {fig['p90_ms']:+.2f} ms (n {fig['n']})"

    return (f"door latency ({row['profile']}): Envoy + EPP over Envoy alone idle {f(row['idle'][f'{EPP} - {ALONE}'])}, "
            f"loaded {f(row['loaded'][f'{EPP} - {ALONE}'])}; gateway over direct loaded "
            f"{f(row['loaded'][f'{GATEWAY} - {DIRECT}'])}; picker CPU {row['picker_cpu_ms_per_request']:.2f} ms/req")


def picker_preflight(workdir: Path, profile: Profile, *, epp_site: str) -> float:
    """Before any engine starts: a picker of `profile` starts (its gRPC packages import) and Envoy's binary is
    there; the seconds the picker took. Raises (with the picker's log) otherwise."""
    from fleetgate.bench.envoy import MISSING, envoy_binary

    if envoy_binary() is None:
        raise RuntimeError(MISSING)
    spec = PickerSpec(model="preflight", urls=["http://127.0.0.1:9"], keys=Keys.make(1), workdir=workdir,
                      kv_events=[], epp_site=epp_site)
    picker = start_picker(spec, profile, grpc_port=free_port())
    picker.stop()
    return picker.started_s
