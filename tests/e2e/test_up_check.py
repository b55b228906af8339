"""The README's command, tested: `fleetgate up --check` brings up a real engine and the gateway,
answers one chat request, exits 0, and leaves no engine process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_engine

FLEETGATE = Path(sys.executable).with_name("fleetgate")


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment carries `marker` (engines and their children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state not in {"Z", "X"}:
            found.append(int(entry.name))
    return found


def test_up_check_answers_and_leaves_no_engine(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(f"engine:\n  max_model_len: 512\n  log_dir: {tmp_path / 'logs'}\n")
    marker = f"fleetgate-test-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONSAFEPATH": "1", "FLEETGATE_TEST_MARKER": marker}
    proc = subprocess.run(
        [str(FLEETGATE), "up", "--check", "--config", str(config), "--port", "0", "--engine-base-port", "0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    match = re.search(r"^A: (.+)$", proc.stdout, re.M)
    assert match and match.group(1).strip(), proc.stdout
    assert "FleetGate is up: http://127.0.0.1:" in proc.stderr
    assert "curl -s http://127.0.0.1:" in proc.stderr
    assert (tmp_path / "logs" / "engine-0.log").stat().st_size > 0
    deadline = time.monotonic() + 10
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes survived `fleetgate up --check`: {left}"
