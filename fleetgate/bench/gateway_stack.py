"""The processes of `fleetgate bench gateway`: the fake engine, the floor, and one gateway per configuration.

Gateway configurations (what a phase of the benchmark runs against):
- `minimal`: every stage a no-op (round-robin, open auth, no limits, accounting, cache or tiers);
- `full, cache off`: the shipped stages (API keys with one provisioned benchmark tenant, limits,
  accounting, round-robin, the per-request log line) and no response cache;
- `full, cache on`: the same plus the response cache with the semantic layer (`--embedder`); `remote`: its
  encoder is a service, `--encoder-url` or the loopback stub `Stack.encoder` starts.

The benchmark tenant's key is made here (`new_key`) and only its hash goes into the gateway's config, as
in production; every request carries it (the engine ignores it). Gateways and the floor may be pinned to
one CPU (`sched_setaffinity` in the child), the engine to the others, so "per core" figures mean one core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetgate.core.localredis import free_port

MODEL = "bench"
TENANT = "bench"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    metrics_url: str | None = None  # a gateway's Prometheus endpoint
    grpc_port: int | None = None  # an Endpoint Picker's ext_proc port

    def cpu_s(self) -> float:
        """CPU seconds used so far (user + system, all threads)."""
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


@dataclass
class Pinning:
    gateway: set[int] | None  # CPUs of the gateways and the floor
    others: set[int] | None  # CPUs of the engine, wrk and this process

    @classmethod
    def choose(cls, gateway_cpu: int | None) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0))
        if gateway_cpu is None or len(cpus) < 2 or gateway_cpu not in cpus:
            return cls(gateway=None, others=None)
        return cls(gateway={gateway_cpu}, others=set(cpus) - {gateway_cpu})


def terminate(popen: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM, and SIGKILL after `grace_s`."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def gateway_settings(*, kind: str, port: int, engine_url: str, key_hash: str, embedder: str,
                     log_requests: bool, encoder_url: str | None = None,
                     encoder_timeout_ms: float | None = None) -> dict[str, Any]:
    settings: dict[str, Any] = {
        # Its own free metrics port: several gateways of one run must not clash on the default.
        "server": {"port": port, "metrics_port": free_port(), "log_requests": log_requests, "auth": "api_key"},
        "models": [{"name": MODEL, "endpoints": [engine_url]}],
        "tenancy": {"tenants": [{"id": TENANT, "key_hashes": [key_hash]}]},
        "cache": {"enabled": False},
    }
    if kind == "full, cache on":
        # The fake engine always stops at max_tokens ("length"): store those answers so hits can happen.
        # `NAME+memo`: the shipped exact-text embedding memo on; plain NAME: off, so that no lookup skips the
        # encoder by repeating a text. `NAME+encode-all`: the static prefilter off, so every lookup encodes.
        # `NAME+veto`: the pair veto (`semantic.pair_veto`, off as shipped) on.
        name, *flags = embedder.split("+")
        semantic: dict[str, Any] = {"embedder": name} if "memo" in flags else {"embedder": name, "embed_memo": 0}
        if "encode-all" in flags:
            semantic["prefilter"] = "off"
        if "veto" in flags:
            semantic["pair_veto"] = {"enabled": True}
        if name == "remote":  # the encoder service: `--encoder-url`, or the loopback stub (`Stack.encoder`)
            semantic["remote"] = {"url": encoder_url}
            if encoder_timeout_ms is not None:
                semantic["remote"]["timeout_ms"] = encoder_timeout_ms
        settings["cache"] = {"enabled": True, "store_truncated": True, "semantic": semantic}
    return settings


def _wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


@dataclass
class Stack:
    pinning: Pinning
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def start_process(self, name: str, argv: list[str], *, url: str, ready: str, cpus: set[int] | None) -> Proc:
        """`python -m <argv>` with this stack's environment, pinned to `cpus`; returns once `url + ready` is 200."""
        env = {**os.environ, "PYTHONSAFEPATH": "1"}

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        popen = subprocess.Popen([sys.executable, "-m", *argv], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, preexec_fn=pin)
        proc = Proc(name=name, popen=popen, url=url)
        self.procs.append(proc)
        _wait_http(url + ready, timeout_s=60, proc=popen)
        return proc

    def engine(self) -> Proc:
        port = free_port()
        return self.start_process("engine", ["fleetgate.sim.fake_engine", "--port", str(port), "--model", MODEL],
                           url=f"http://127.0.0.1:{port}", ready="/health", cpus=self.pinning.others)

    def floor(self, engine_url: str) -> Proc:
        port = free_port()
        return self.start_process("floor", ["fleetgate.bench.gateway_overhead", "passthrough", str(port), engine_url],
                           url=f"http://127.0.0.1:{port}", ready="/", cpus=self.pinning.gateway)

    def encoder(self) -> Proc:
        """The loopback stand-in for an encoder service (`fleetgate.bench.encoder_stub`: MiniLM fp32 vectors from
        a precomputed table), on the engine's CPUs."""
        port = free_port()
        return self.start_process("encoder", ["fleetgate.bench.encoder_stub", "--port", str(port)],
                                  url=f"http://127.0.0.1:{port}", ready="/health", cpus=self.pinning.others)

    def gateway(self, *, kind: str, engine_url: str, key_hash: str, embedder: str, log_requests: bool,
                encoder_url: str | None = None, encoder_timeout_ms: float | None = None) -> Proc:
        port = free_port()
        config = self.tmp / f"gateway-{port}.yaml"
        settings = gateway_settings(kind=kind, port=port, engine_url=engine_url, key_hash=key_hash,
                                    embedder=embedder, log_requests=log_requests, encoder_url=encoder_url,
                                    encoder_timeout_ms=encoder_timeout_ms)
        config.write_text(yaml.safe_dump(settings))
        argv = (["fleetgate.bench.gateway_overhead", "minimal", str(config)] if kind == "minimal"
                else ["fleetgate", "gateway", "--config", str(config)])
        proc = self.start_process(kind, argv, url=f"http://127.0.0.1:{port}", ready="/readyz",
                                  cpus=self.pinning.gateway)
        if kind != "minimal":  # the no-op gateway serves no metrics
            proc.metrics_url = f"http://127.0.0.1:{settings['server']['metrics_port']}/metrics"
        return proc

    def stop(self, proc: Proc) -> None:
        terminate(proc.popen)
        self.procs.remove(proc)


@contextmanager
def stack(pinning: Pinning) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="fleetgate-bench-") as tmp:
        s = Stack(pinning=pinning, tmp=Path(tmp))
        try:
            yield s
        finally:
            for proc in list(s.procs):
                s.stop(proc)
