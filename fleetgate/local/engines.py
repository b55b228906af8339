"""Engine subprocesses for the local stack: start, wait for `/health`, stop without orphans.

Each engine runs in its own session (process group), so Ctrl-C in the terminal reaches only
`fleetgate up`, which then stops the engines in order: SIGTERM to the whole group (vLLM's API
server and its engine-core child), SIGKILL to the group after `stop_grace_s`. On Linux each
engine runs under `group_guard`, which gets PR_SET_PDEATHSIG: if `fleetgate up` itself is killed, the
guard ends the engine's whole process group (the death signal alone would reach only one process and
leave the engine's children orphaned).

Start-up waits for every engine's `GET /health` to answer 200, printing one progress line with
the elapsed seconds and each engine's last log line; an engine that exits, or a timeout, stops
all engines and raises `EngineStartError` carrying the log tail.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fleetgate.local.errors import EngineStartError

PR_SET_PDEATHSIG = 1
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineSpec:
    """How to run one engine: its command, environment, URL and log file."""

    name: str
    argv: Sequence[str]
    env: dict[str, str]
    url: str  # base URL, no trailing slash, no /v1
    log_path: Path
    health_path: str = "/health"
    # When set, the engine only counts as ready once `GET /v1/models` lists this name: a port
    # picked up front can be taken by another server before vLLM binds it (vLLM binds late, after
    # loading the model, with SO_REUSEPORT), and that server's /health must not fool us.
    expect_model: str | None = None
    # Where the engine publishes KV-cache events (`--kv-events-config`), when it does: ZMQ addresses.
    kv_publisher: str | None = None
    kv_replay: str | None = None


@dataclass(kw_only=True)
class EngineProcess:
    spec: EngineSpec
    popen: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)
    guarded: bool = False  # runs under `group_guard`, which passes a stop to the whole group itself

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, *, lines: int = 30) -> str:
        try:
            with open(self.spec.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def last_log_line(self, *, width: int = 90) -> str:
        tail = self.log_tail(lines=1).strip()
        return tail if len(tail) <= width else "..." + tail[-(width - 3) :]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM us when our parent dies.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def healthy(url: str, *, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def serves_model(base_url: str, model: str, *, timeout_s: float = 2.0) -> bool:
    """True when `GET /v1/models` at `base_url` lists `model`."""
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=timeout_s) as response:
            data = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    models = data.get("data", []) if isinstance(data, dict) else []
    return any(isinstance(m, dict) and m.get("id") == model for m in models)


def ready(spec: EngineSpec) -> bool:
    if not healthy(spec.url + spec.health_path):
        return False
    return spec.expect_model is None or serves_model(spec.url, spec.expect_model)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class EngineFleet:
    """A set of engine subprocesses with one lifecycle; use as a context manager."""

    def __init__(
        self,
        *,
        specs: Sequence[EngineSpec],
        startup_timeout_s: float = 600.0,
        stop_grace_s: float = 15.0,
        progress: Progress = _stderr,
        poll_s: float = 0.5,
    ) -> None:
        self.specs = list(specs)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.progress = progress
        self.poll_s = poll_s
        self.processes: list[EngineProcess] = []

    @property
    def urls(self) -> list[str]:
        return [spec.url for spec in self.specs]

    def launch(self) -> None:
        """Start every engine process (does not wait for health)."""
        for spec in self.specs:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(spec.log_path, "wb") as log:
                linux = sys.platform.startswith("linux")
                # By path, with -P (no script folder or cwd on sys.path): the guard needs only the stdlib.
                guard = [sys.executable, "-P", str(Path(__file__).with_name("group_guard.py")), str(self.stop_grace_s)]
                argv = [*guard, "--", *spec.argv] if linux else list(spec.argv)
                popen = subprocess.Popen(
                    argv,
                    env=spec.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if linux else None,
                )
            self.processes.append(EngineProcess(spec=spec, popen=popen, guarded=linux))

    def wait_healthy(self) -> float:
        """Block until every engine answers `/health`; returns the seconds waited."""
        start = time.monotonic()
        pending = {p.spec.name: p for p in self.processes}
        last_print = 0.0
        interactive = sys.stderr.isatty()
        while pending:
            for name, proc in list(pending.items()):
                code = proc.exited()
                if code is not None:
                    self._fail(f"engine {name} exited with code {code} during start-up", proc)
                if ready(proc.spec):
                    del pending[name]
                    self.progress(f"    engine {name} ready at {proc.spec.url} ({time.monotonic() - start:.0f}s)")
            elapsed = time.monotonic() - start
            if pending and elapsed > self.startup_timeout_s:
                proc = next(iter(pending.values()))
                self._fail(f"engine {proc.spec.name} not healthy after {self.startup_timeout_s:.0f}s", proc)
            if pending and (interactive or elapsed - last_print >= 10.0):
                last_print = elapsed
                proc = next(iter(pending.values()))
                line = f"    waiting for {len(pending)} engine(s): {elapsed:4.0f}s | {proc.last_log_line()}"
                if interactive:
                    print("\r\033[K" + line, end="", file=sys.stderr, flush=True)
                else:
                    self.progress(line)
            if pending:
                time.sleep(self.poll_s)
        if interactive:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        return time.monotonic() - start

    def _fail(self, message: str, proc: EngineProcess) -> None:
        tail = proc.log_tail()
        self.stop()
        raise EngineStartError(f"{message}; log {proc.spec.log_path}, last lines:\n{tail}")

    def start(self) -> float:
        """Launch and wait for health; on any failure every engine is stopped before raising."""
        try:
            self.launch()
            return self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM each engine's process group, then SIGKILL what is left after the grace period."""
        live = [p for p in self.processes if p.exited() is None]
        for proc in live:
            if proc.guarded:  # the guard signals the group once; a second SIGTERM makes vLLM's server force-quit
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
            else:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.processes:
            # Kill the group even when the leader is gone: its children may still hold the port.
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        self.processes = []

    def __enter__(self) -> EngineFleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
