"""Start a throwaway `redis-server` on a free loopback port (tests, benchmarks, `fleetgate up --redis`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """A redis-server child process bound to 127.0.0.1 with persistence off."""

    def __init__(self, *, port: int | None = None, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("redis-server") or ""
        if not self.binary:
            raise FileNotFoundError(
                "redis-server not found on PATH; install it with `apt-get install redis-server` "
                "(`make install` does this)"
            )
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="fleetgate-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (a wrapper that `exec`s the binary keeps its id)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, timeout_s: float = 10.0) -> LocalRedis:
        self._proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no shutdown, and (persistence off) all data lost."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._proc = None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
        shutil.rmtree(Path(self._dir), ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
