"""One door of the live benchmark as N gateway replicas of one profile sharing one Redis (`--gateway-replicas`).

What a deployment with the chart's `replicas` does: every replica is the full gateway in its own process (its own
event loop relays its share of the streams), and the state that must agree between them (tenancy, limits, the usage
ledger, the router's prefix index) lives in one Redis (`redis_url`). Here that Redis is a real `redis-server` started
for the door on a free loopback port (`fleetgate.core.localredis`, from `$FLEETGATE_REDIS_SERVER` or PATH) and
stopped with it, so no point inherits another's prefix index or charges.

A `GatewayGroup` is the door: `url` is replica 0's (the usage API reads through it: the ledger is shared),
`urls` all of them (the load generator spreads requests over them in turn, as a Kubernetes Service spreads
connections; the overhead probe alternates them), `cpu_s` the sum over the replicas' processes. With one replica
and no `redis` it is exactly one in-memory gateway process, as before this option.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgate.bench.live_gateway import GatewayProcess, Keys, Profile, start_gateway
from fleetgate.core.errors import ConfigError
from fleetgate.core.localredis import LocalRedis

REDIS_ENV = "FLEETGATE_REDIS_SERVER"


def redis_server() -> str | None:
    """The redis-server to start: `$FLEETGATE_REDIS_SERVER` (an executable, e.g. `scripts/gpu/redis_site.sh`'s
    wrapper) or the one on PATH; None when there is neither."""
    explicit = os.environ.get(REDIS_ENV, "")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("redis-server")


def needs_redis(replicas: int, redis: bool) -> bool:
    return replicas > 1 or redis


def require_redis(replicas: int, *, redis: bool = False) -> str | None:
    """The redis-server binary when the doors need one (several replicas, or `redis`), else None; `ConfigError`
    with what to do when they need one and there is none (checked before any engine or gateway starts)."""
    if replicas < 1:
        raise ConfigError(f"--gateway-replicas must be at least 1, got {replicas}")
    if not needs_redis(replicas, redis):
        return None
    binary = redis_server()
    if binary is None:
        where = os.environ.get(REDIS_ENV)
        raise ConfigError(
            f"--gateway-replicas {replicas}{' --gateway-redis' if redis else ''}: the replicas share their state "
            f"through Redis, and there is no redis-server ("
            + (f"${REDIS_ENV}={where} is not an executable" if where else f"${REDIS_ENV} unset, none on PATH")
            + "): install redis-server, or on the GPU machine `source scripts/gpu/redis_site.sh` (its archive from "
            "scripts/gpu/pack_redis.py)")
    return binary


@dataclass
class GatewayGroup:
    """The gateway replicas of one door and their Redis (see the module docstring)."""

    profile: str
    replicas: list[GatewayProcess]
    redis: LocalRedis | None = None

    @property
    def url(self) -> str:
        return self.replicas[0].url

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(g.url for g in self.replicas)

    @property
    def metrics_urls(self) -> tuple[str, ...]:
        return tuple(g.metrics_url for g in self.replicas)

    @property
    def started_s(self) -> float:
        """The door's start: its replicas start at once, so the slowest of them."""
        return max(g.started_s for g in self.replicas)

    @property
    def loop_paths(self) -> list[Path | None]:
        return [g.loop_path for g in self.replicas]

    def cpu_s(self) -> float:
        """CPU seconds of the door: the sum over its gateway processes (Redis apart: `redis_cpu_s`)."""
        return sum(self.cpu_each())

    def cpu_each(self) -> list[float]:
        return [g.cpu_s() for g in self.replicas]

    def redis_cpu_s(self) -> float | None:
        """CPU seconds the door's redis-server has used; None without one (or once it stopped)."""
        pid = self.redis.pid if self.redis is not None else None
        return proc_cpu_s(pid) if pid is not None else None

    def stop(self) -> None:
        try:
            with ThreadPoolExecutor(max_workers=max(1, len(self.replicas))) as pool:
                list(pool.map(lambda g: g.stop(), self.replicas))
        finally:
            if self.redis is not None:
                self.redis.stop()


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (all threads); None when it is gone."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")


def start_gateways(profile: Profile, *, replicas: int, redis_binary: str | None, model: str, urls: list[str],
                   keys: Keys, workdir: Path, timeout_s: float = 60.0, kv_events: list[dict[str, Any]] | None = None,
                   server: dict[str, Any] | None = None) -> GatewayGroup:
    """Start `replicas` gateways of `profile` at once, sharing a fresh redis-server when `redis_binary` is given
    (required with more than one replica), and wait until every one answers `/readyz`. A replica that fails stops
    the others and the Redis, and its error is raised."""
    if replicas > 1 and not redis_binary:
        raise ConfigError(f"{replicas} gateway replicas share their state through Redis: no redis-server given")
    redis = LocalRedis(binary=redis_binary).start() if redis_binary else None
    redis_url = redis.url if redis is not None else None

    def one(_: int) -> GatewayProcess:
        return start_gateway(profile, model=model, urls=urls, keys=keys, workdir=workdir, timeout_s=timeout_s,
                             kv_events=kv_events, server=server, redis_url=redis_url)

    started: list[GatewayProcess] = []
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=replicas) as pool:
        for future in [pool.submit(one, i) for i in range(replicas)]:
            try:
                started.append(future.result())
            except Exception as exc:  # each replica's outcome is wanted
                errors.append(exc)
    group = GatewayGroup(profile=profile.name, replicas=started, redis=redis)
    if errors:
        group.stop()
        raise errors[0]
    return group
