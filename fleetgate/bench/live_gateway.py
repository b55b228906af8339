"""The gateway of a live routing benchmark: one subprocess per routing profile, the full request path.

Each profile runs the real gateway (`fleetgate.gateway.serve.build_server`: API keys, limits, accounting,
endpoint picking, the streaming relay) in its own process, so its CPU time is its own (read from
`/proc/PID/stat`) and the load generator's event loop does not share its core. In-memory state (no
Redis) by default; with `redis_url` the state a deployment shares between replicas (tenancy, limits, the usage
ledger, the router's prefix index) lives in that Redis, and `fleetgate.bench.live_replicas` starts several such
processes of one profile as one door.

Profiles (`resolve_profile`): `round-robin` (the baseline: the gateway's stages with
`fleetgate.router.roundrobin.RoundRobinScheduler` in place of the plugin scheduler); any name with a
routing YAML given as `NAME=PATH` (`--profile-config`); else a preset of `fleetgate.router.config.preset`
(`least-loaded`, `default`, `prefix-only`, and whatever presets main adds, such as `precise-prefix`).
A routing YAML may hold `${VAR}` placeholders, filled from the run (`template_vars`): `ENGINE_URLS` (a
JSON list), `KV_EVENTS_ENDPOINTS` (a JSON list of the engines' ZMQ publishers, in the same order; `[]`
when the engines publish none), `MODEL_DIR` (the engines' model directory, for a tokenizer) and
`BLOCK_SIZE` (tokens per KV block).

The gateway serves the engines' model as `model` (with the engines' KV-event addresses in its route's
`kv_events` when they publish, for the precise-prefix scorer), plus `probe-<i>` (engine i alone) for the
paired direct-vs-gateway latency probe. Tenants `t0..tN-1` and an admin key are provisioned; only hashes go into
the config. `python -m fleetgate.bench.live_gateway CONFIG [--round-robin]` is the child's entry point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import yaml

from fleetgate.core.config import load_yaml
from fleetgate.core.errors import ConfigError
from fleetgate.core.localredis import free_port

ROUND_ROBIN = "round-robin"


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    routing: dict[str, Any] | None  # a RoutingConfig mapping (camelCase); None for round-robin


def resolve_profile(name: str, *, configs: Mapping[str, Path], variables: Mapping[str, str]) -> Profile:
    """The routing of profile `name` (see the module docstring); `ConfigError` when it names none."""
    from fleetgate.router.config import RoutingConfig, preset

    if name == ROUND_ROBIN:
        return Profile(name=name, routing=None)
    if name in configs:
        path = configs[name]
        try:
            text = Template(path.read_text(encoding="utf-8")).substitute(variables)
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"routing profile {name}: {path} uses an unknown placeholder ({exc})") from exc
        except OSError as exc:
            raise ConfigError(f"routing profile {name}: cannot read {path}: {exc}") from exc
        data = yaml.safe_load(text) or {}
        RoutingConfig.model_validate(data)  # fail here, not in the child
        return Profile(name=name, routing=data)
    try:
        cfg = preset(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return Profile(name=name, routing=cfg.model_dump(by_alias=True, mode="json"))


def template_vars(*, urls: list[str], kv_events: list[str], model_dir: str, block_size: int) -> dict[str, str]:
    return {"ENGINE_URLS": json.dumps(urls), "KV_EVENTS_ENDPOINTS": json.dumps(kv_events), "MODEL_DIR": model_dir,
            "BLOCK_SIZE": str(block_size)}


@dataclass(frozen=True, slots=True)
class Keys:
    """API keys of the benchmark's tenants and admin (kept in this process; hashes go to the gateway)."""

    tenants: dict[str, str]
    admin: str

    @classmethod
    def make(cls, tenants: int) -> Keys:
        from fleetgate.gateway.tenancy.keys import new_key

        return cls(tenants={f"t{i}": new_key()[0] for i in range(tenants)}, admin=new_key()[0])


def kv_event_routes(*, urls: list[str], publishers: list[str], replays: list[str], topic: str
                    ) -> list[dict[str, Any]]:
    """The route's `kv_events` entries (engine i publishes on publishers[i], replays on replays[i])."""
    routes = []
    for i, (url, publisher) in enumerate(zip(urls, publishers, strict=False)):
        entry: dict[str, Any] = {"endpoint": url, "publisher": publisher, "topic": topic}
        if i < len(replays):
            entry["replay"] = replays[i]
        routes.append(entry)
    return routes


def gateway_settings(*, port: int, metrics_port: int, model: str, urls: list[str], keys: Keys,
                     routing: dict[str, Any] | None, kv_events: list[dict[str, Any]] | None = None,
                     server: dict[str, Any] | None = None, redis_url: str | None = None) -> dict[str, Any]:
    """`redis_url`: the Redis that replicas of one door share (None: in-memory state). `kv_events`: where the
    engines publish KV events, for a precise-prefix profile; given to the route only
    where this build's `ModelRoute` has the field (older builds have no precise scorer to use them). `server`:
    settings of the gateway's `server` section added for one point (e.g. `cancel_finish_tokens`)."""
    from fleetgate.gateway.settings import ModelRoute
    from fleetgate.gateway.tenancy.keys import hash_key

    models: list[dict[str, Any]] = [{"name": model, "endpoints": urls}]
    if kv_events and "kv_events" in ModelRoute.model_fields:
        models[0]["kv_events"] = kv_events
    models += [{"name": f"probe-{i}", "endpoints": [u], "served_name": model} for i, u in enumerate(urls)]
    settings: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "metrics_port": metrics_port, "log_requests": False,
                   "auth": "api_key", "debug_headers": True, "first_byte_timeout_s": 300.0, **(server or {})},
        "models": models,
        "tenancy": {"admin_key_hashes": [hash_key(keys.admin)],
                    "tenants": [{"id": t, "key_hashes": [hash_key(k)]} for t, k in keys.tenants.items()]},
        "cache": {"enabled": False},
    }
    if routing is not None:
        settings["routing"] = routing
    if redis_url:
        settings["redis_url"] = redis_url
    return settings


@dataclass
class GatewayProcess:
    profile: str
    popen: subprocess.Popen[bytes]
    url: str
    metrics_url: str
    log_path: Path
    started_s: float = 0.0  # seconds from launch to ready
    loop_path: Path | None = None  # where the child writes its loop watch when it stops (`watch_loop`)

    def cpu_s(self) -> float:
        """CPU seconds the gateway process has used (user + system, all threads)."""
        fields_ = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, *, grace_s: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def http_ok(url: str) -> bool:
    """True when GET `url` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start_gateway(profile: Profile, *, model: str, urls: list[str], keys: Keys, workdir: Path,
                  timeout_s: float = 60.0, kv_events: list[dict[str, Any]] | None = None,
                  server: dict[str, Any] | None = None, redis_url: str | None = None) -> GatewayProcess:
    """Launch the gateway of `profile` and wait until it answers `/readyz` (its log is kept in `workdir`)."""
    port, metrics_port = free_port(), free_port()
    settings = gateway_settings(port=port, metrics_port=metrics_port, model=model, urls=urls, keys=keys,
                                routing=profile.routing, kv_events=kv_events, server=server, redis_url=redis_url)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", profile.name)
    config = workdir / f"gateway-{safe}-{port}.yaml"
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    log_path = workdir / f"gateway-{safe}-{port}.log"
    argv = [sys.executable, "-m", "fleetgate.bench.live_gateway", str(config)]
    if profile.routing is None:
        argv.append("--round-robin")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, env={**os.environ, "PYTHONSAFEPATH": "1"}, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT)
    proc = GatewayProcess(profile=profile.name, popen=popen, url=f"http://127.0.0.1:{port}",
                          metrics_url=f"http://127.0.0.1:{metrics_port}/metrics", log_path=log_path,
                          loop_path=config.with_suffix(".loop.json"))
    while not http_ok(proc.url + "/readyz"):
        if popen.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.stop()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"gateway for profile {profile.name} did not start:\n{tail}")
        time.sleep(0.05)
    proc.started_s = time.monotonic() - t0
    return proc


def serve(config: str, *, round_robin: bool) -> None:
    """The child: the gateway from `config`, with round-robin endpoint picking when asked."""
    from fleetgate.core.config import parse_model
    from fleetgate.gateway.serve import build_server
    from fleetgate.gateway.settings import GatewaySettings

    settings = parse_model(GatewaySettings, load_yaml(config), source=config)
    overrides: dict[str, Any] = {}
    if round_robin:
        from fleetgate.router.roundrobin import RoundRobinScheduler

        overrides["scheduler"] = RoundRobinScheduler()
    server = build_server(settings, freeze_heap=True, **overrides)
    watch_loop(server, Path(config).with_suffix(".loop.json"))
    server.run()


def watch_loop(server: Any, path: Path) -> None:
    """Watch `server`'s event loop once it listens (`loop_watch.LoopWatch`: its lag and GC pauses, with their times)
    and write what was seen to `path` when its drain starts (after `run()` uvicorn re-raises the SIGTERM)."""
    from fleetgate.bench.loop_watch import LoopWatch

    watch = LoopWatch()
    startup, shutdown = server.startup, server.shutdown

    async def startup_then_watch(sockets: Any = None) -> None:
        await startup(sockets=sockets)
        watch.start()

    async def dump_then_shutdown(sockets: Any = None) -> None:
        watch.stop()
        watch.dump(path)
        await shutdown(sockets=sockets)

    server.startup, server.shutdown = startup_then_watch, dump_then_shutdown


def main(argv: list[str]) -> int:
    serve(argv[0], round_robin="--round-robin" in argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
