"""The engine runner with a tiny fake engine: health wait, start-up death, no orphans on stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetgate.local.engines import EngineFleet, EngineSpec, free_port, healthy
from fleetgate.local.errors import EngineStartError

# A fake engine: writes its own pid and a child's pid, serves /health after `delay` seconds,
# optionally ignores SIGTERM (to force the SIGKILL path) or dies during start-up.
FAKE = r"""
import http.server, os, signal, subprocess, sys, threading, time
port, delay, mode, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(pidfile, "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "count":  # like uvicorn (vLLM's server): the first SIGTERM stops gracefully, a second forces
    def on_term(signum, frame):
        with open(pidfile + ".term", "a") as f:
            f.write("TERM\n")
        signal.signal(signal.SIGTERM, on_term)
        threading.Timer(0.5, os._exit, (0,)).start()
    signal.signal(signal.SIGTERM, on_term)
print("loading weights", flush=True)
time.sleep(delay)
if mode == "die":
    print("RuntimeError: out of KV cache memory", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("ready", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in {"Z", "X"}


def _alive(pid: int, *, settle_s: float = 5.0) -> bool:
    """True if `pid` still runs after `settle_s`: a SIGKILLed process takes a moment to exit on a busy box."""
    deadline = time.monotonic() + settle_s
    while _running(pid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _spec(tmp_path: Path, name: str, *, delay: float = 0.2, mode: str = "ok") -> EngineSpec:
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE)
    port = free_port()
    return EngineSpec(
        name=name,
        argv=[sys.executable, str(script), str(port), str(delay), mode, str(tmp_path / f"{name}.pids")],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        url=f"http://127.0.0.1:{port}",
        log_path=tmp_path / "logs" / f"{name}.log",
    )


def _pids(tmp_path: Path, name: str) -> list[int]:
    deadline = time.monotonic() + 10
    path = tmp_path / f"{name}.pids"
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "fake engine never wrote its pids"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def test_start_waits_for_health_then_stop_leaves_no_process(tmp_path: Path) -> None:
    specs = [_spec(tmp_path, "engine-0", delay=0.5), _spec(tmp_path, "engine-1", delay=0.1)]
    lines: list[str] = []
    fleet = EngineFleet(specs=specs, startup_timeout_s=30, stop_grace_s=5, progress=lines.append, poll_s=0.1)
    with fleet:
        fleet.start()
        assert all(healthy(url + "/health") for url in fleet.urls)
        pids = _pids(tmp_path, "engine-0") + _pids(tmp_path, "engine-1")
        assert all(_running(pid) for pid in pids)
    assert not [pid for pid in pids if _alive(pid)], "engine or engine child survived stop()"
    assert any("engine-0 ready" in line for line in lines)
    assert "loading weights" in (tmp_path / "logs" / "engine-0.log").read_text()


def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    fleet = EngineFleet(specs=[_spec(tmp_path, "engine-0", mode="stubborn")], stop_grace_s=0.5, progress=print)
    fleet.start()
    pids = _pids(tmp_path, "engine-0")
    started = time.monotonic()
    fleet.stop()
    assert time.monotonic() - started < 8
    assert not [pid for pid in pids if _alive(pid)]


def test_death_during_startup_reports_the_log_tail_and_cleans_up(tmp_path: Path) -> None:
    specs = [_spec(tmp_path, "engine-0", delay=1.0, mode="die"), _spec(tmp_path, "engine-1", delay=30)]
    fleet = EngineFleet(specs=specs, startup_timeout_s=60, stop_grace_s=2, progress=print, poll_s=0.1)
    fleet.launch()
    # Both fakes (and the sibling's child) exist before engine-0 dies: the sibling must be stopped too.
    pids = _pids(tmp_path, "engine-0") + _pids(tmp_path, "engine-1")
    with pytest.raises(EngineStartError) as info:
        fleet.wait_healthy()
    message = str(info.value)
    assert "engine-0 exited with code 3" in message
    assert "out of KV cache memory" in message
    assert str(specs[0].log_path) in message
    assert not [pid for pid in pids if _alive(pid)], "the healthy sibling must be stopped too"
    assert fleet.processes == []


def test_startup_timeout_is_reported(tmp_path: Path) -> None:
    fleet = EngineFleet(specs=[_spec(tmp_path, "engine-0", delay=60)], startup_timeout_s=1, stop_grace_s=2,
                        progress=print, poll_s=0.1)
    fleet.launch()
    pids = _pids(tmp_path, "engine-0")
    with pytest.raises(EngineStartError, match=r"not healthy after 1s[\s\S]*loading weights"):
        fleet.wait_healthy()
    assert not [pid for pid in pids if _alive(pid)]


def test_keyboard_interrupt_while_waiting_stops_engines(tmp_path: Path) -> None:
    calls = {"n": 0}

    def interrupt(_line: str) -> None:
        calls["n"] += 1
        raise KeyboardInterrupt

    fleet = EngineFleet(specs=[_spec(tmp_path, "engine-0", delay=60)], stop_grace_s=2, progress=interrupt,
                        poll_s=0.1)
    with pytest.raises(KeyboardInterrupt):
        fleet.start()
    assert calls["n"] == 1
    assert not [pid for pid in _pids(tmp_path, "engine-0") if _alive(pid)]


def test_engines_die_when_their_parent_is_killed(tmp_path: Path) -> None:
    # `fleetgate up` killed with SIGKILL runs no cleanup: PR_SET_PDEATHSIG must still end its engines.
    spec = _spec(tmp_path, "engine-0", delay=0.1)
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from fleetgate.local.engines import EngineFleet, EngineSpec\n"
        f"spec = EngineSpec(name='engine-0', argv={list(spec.argv)!r}, env=dict(__import__('os').environ),\n"
        f"                  url={spec.url!r}, log_path=Path({str(spec.log_path)!r}))\n"
        "EngineFleet(specs=[spec], progress=lambda _: None).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONSAFEPATH": "1"}, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        leader = _pids(tmp_path, "engine-0")[0]
        assert _running(leader)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not _alive(leader, settle_s=10), "the engine outlived a SIGKILLed parent"
    # ... and so did the engine's own children (the death signal alone reached only one process).
    assert not [pid for pid in _pids(tmp_path, "engine-0") if _alive(pid)], "an engine's child was orphaned"


def test_a_stop_sends_the_engine_one_sigterm(tmp_path: Path) -> None:
    """vLLM's server (uvicorn) force-quits on a second SIGTERM: the engine must get exactly one."""
    fleet = EngineFleet(specs=[_spec(tmp_path, "engine-0", mode="count")], stop_grace_s=5, progress=lambda _: None,
                        poll_s=0.1)
    fleet.start()
    fleet.stop()
    assert (tmp_path / "engine-0.pids.term").read_text() == "TERM\n"
    assert not [pid for pid in _pids(tmp_path, "engine-0") if _alive(pid)]
