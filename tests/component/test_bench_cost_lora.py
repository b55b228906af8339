"""`fleetgate bench cost --lora` on a tiny workload: the three configurations run through the real gateway over
HTTP to simulated engines and print their rows, targets and sizing table (the figures are not asserted:
that is the benchmark's job, not a test's)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from fleetgate.bench import cost


def test_lora_comparison_runs_end_to_end_on_a_tiny_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cost.add_arguments(parser)
    args = parser.parse_args(
        [
            "--lora",
            "--requests",
            "30",
            "--rate",
            "30",
            "--time-scale",
            "0.25",
            "--fine-tunes",
            "3",
            "--max-loras",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert cost.run(args) == 0  # 0: no request failed in any configuration
    out = capsys.readouterr().out
    for config in ("deployments", "adapters+affinity", "adapters+blind"):
        assert any(line.startswith(config + " ") for line in out.splitlines()), config
    assert "TTFT p50 within 1.5x" in out and "beats adapter-blind" in out and "GPUs: shared base" in out
    report = json.loads((tmp_path / "cost-report-lora.json").read_text())
    rows = {r["config"]: r for r in report["rows"]}
    assert all(r["requests"] == 30 and r["errors"] == 0 for r in rows.values())
    # the fleets: one deployment per fine-tune (at least a replica each) against one shared base
    assert rows["deployments"]["gpus"] >= 3 and rows["adapters+affinity"]["gpus"] == rows["adapters+blind"]["gpus"]
    # the adapters were loaded on demand by the gateway, never in the deployments layout
    assert rows["adapters+affinity"]["disk_loads"] >= 3 and rows["deployments"]["disk_loads"] == 0
