"""`--gateway-replicas 2` end to end on simulated engines: each door is two gateway processes sharing a real
redis-server, the requests and probes reach both, the door's CPU is their sum, the charges read through one replica
equal what the engines counted (the ledger is shared), and the report says how the doors ran."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fleetgate.bench.live_cli import sim_engines
from fleetgate.bench.live_report import write_reports
from fleetgate.bench.live_routing import LiveOptions, run_live
from fleetgate.sim.workloads import Sizes

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_two_gateway_replicas_per_door_on_simulated_engines(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    options = LiveOptions(
        profiles=["default"], loads=[1.0], window_s=3.0, short_window_s=3.0, drain_s=15.0, unique_loads=[],
        chat_loads=[], accounting_cancel_share=0.0, overhead_window_s=3.0, probe_s=3.0, probe_concurrency=16,
        calibrate=False, budget_s=120.0, overhead_idle_pairs=8, gateway_replicas=2,
        sizes=Sizes(prefix_tokens=256, question_tokens=32, output_tokens=8, tenants=3),
    )
    # children this process had before (in a whole-suite run, other tests' session Redis servers among them)
    before = set(_live_children())
    with sim_engines(replicas=2, kv_blocks=256, time_scale=2.0, log_dir=tmp_path) as urls:
        rows = asyncio.run(run_live(urls, options, out_dir=tmp_path, workdir=tmp_path, log=lambda _: None))
    meta = rows[0]
    assert meta["gateway_replicas"] == 2 and meta["redis_server"]
    measured = [r for r in rows if r["kind"] in ("point", "overhead")]
    assert [r["kind"] for r in measured] == ["point", "point", "overhead"], [r.get("error") for r in rows]
    for r in measured:
        assert r["gateway_replicas"] == 2 and r["usage_shared"] is True, r
        each = r["gateway_cpu_s_each"]
        assert len(each) == 2 and all(c > 0 for c in each), each  # both replicas served requests
        assert r["gateway_cpu_s"] == pytest.approx(sum(each), abs=0.02)
        assert r["redis_cpu_s"] is not None and r["redis_cpu_s"] >= 0
        # what the engines counted = what replica 0 reports for both (no client left early)
        assert r["lost_prompt_tokens"] == 0 and r["lost_completion_tokens"] == 0, r
    for p in measured[:2]:
        assert p["errors"] == 0 and p["charged_requests"] == p["requests"], p
    overhead = measured[2]
    replicas = overhead["loaded_added_by_replica_ms"]
    assert [x["replica"] for x in replicas] == [0, 1]
    # the own-time histogram is read from both replicas: every idle pair's gateway request, whichever served it
    assert overhead["own_idle"]["before_upstream"]["count"] == overhead["idle_pairs"], overhead["own_idle"]
    assert len(overhead["gateway_loops"]) == 2 and all(loop and loop["samples"] > 0
                                                       for loop in overhead["gateway_loops"])
    summary = rows[-1]
    assert summary["kind"] == "accounting" and summary["verdict"] == "PASS", summary
    text = write_reports(rows, out_dir=tmp_path)[0].read_text()
    assert "Gateway: 2 replica processes per door sharing one redis-server" in text
    assert "2 gateway replica(s): loaded added time replica 0:" in text and "ledger shared" in text
    # every replica and its Redis stopped with its door: no child of this process is left running either
    left = [cmd for cmd in set(_live_children()) - before
            if "redis-server" in cmd or "fleetgate.bench.live_gateway" in cmd]
    assert not left, left


def _live_children() -> list[str]:
    """Command lines of this process's children that are still running (not zombies)."""
    import os

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == str(os.getpid()) and not fields.get("State", "").strip().startswith("Z"):
            out.append(cmd)
    return out
