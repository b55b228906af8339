"""`scripts/epp_idle_path.py`, run small against the real Envoy: every door answers, the time-stamped pickers'
steps come back matched to the client's requests, and Envoy's access log and the loaded phase are reported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgate.bench.envoy import MISSING, envoy_binary

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "epp_idle_path.py"

if envoy_binary() is None:  # a dev dependency: its absence is an install problem, said as such
    pytest.fail(MISSING, pytrace=False)


def test_the_idle_path_is_measured_door_by_door_and_step_by_step() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--requests", "3", "--warmup", "1", "--gap-ms", "5", "--trace-epp",
         "--null", "aio", "--envoy-variants", "nolua", "--access-log", "--load-streams", "2", "--load-requests", "4",
         "--load-rounds", "1"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONSAFEPATH": "1"}, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    door_row = re.compile(r"^(envoy alone|epp|null \S+)\s+[\d.]+\s+([+-][\d.]+)")
    rows = {m.group(1): m for line in lines if (m := door_row.match(line))}
    assert set(rows) == {"envoy alone", "epp", "null aio", "null aio+nolua"}
    assert rows["envoy alone"].group(2) == "+0.00"  # the baseline of every "over"
    for door in ("epp", "null aio", "null aio+nolua"):  # each time-stamped picker: every step, on 3 requests
        header = lines.index(f"{door}: p50 ms of each step on the first token's path (3 requests)")
        steps = lines[header + 1]
        assert "sent->open" in steps and "chunk1->chunk1_w1" in steps and "req_body_w1->req_body_w2" in steps
    assert "req_body->req_body_decided" in lines[lines.index("epp: p50 ms of each step on the first token's path "
                                                             "(3 requests)") + 1]
    envoy = [line for line in lines if line.startswith("  epp ") and "us_tx_beg_us" in line]
    assert envoy and "request_header_latency_us" in envoy[0]
    loaded = [line for line in lines if "probe TTFT p50" in line]
    assert len(loaded) == 4 and all("CPU ms/request" in line for line in loaded)
