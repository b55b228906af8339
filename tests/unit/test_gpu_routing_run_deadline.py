"""`scripts/gpu_routing_run.py` stops before any engine starts when its deadline cannot fit the engines' start: on
the GPU machine that start takes 73-165 s, and a deadline leaving less spent 148 s of device time on a start that
was then killed (run 8e, docs/reports/gpu-routing.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_routing_run.py"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_routing_run_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_deadline_too_short_for_the_gpu_engines_is_refused_with_what_to_do() -> None:
    run = script()
    args = run.parse(["--out", "/tmp/unused", "--deadline-s", "190", "--tail-s", "5"])
    why = run.engine_time_short(args, left_s=174)  # 8e: 174 s left at the stamp, 109 s for the engines
    assert why is not None and "109s" in why and "150s" in why and "--deadline-s" in why
    assert run.engine_time_short(args, left_s=420) is None  # 8d's room: 330 s for the engines
    forced = run.parse(["--out", "/tmp/unused", "--tail-s", "5", "--min-engine-start-s", "0"])
    assert run.engine_time_short(forced, left_s=174) is None


def test_simulated_and_cpu_engines_are_not_held_to_the_gpu_start() -> None:
    run = script()
    for engine in ("sim", "vllm-cpu"):
        args = run.parse(["--out", "/tmp/unused", "--engine", engine])
        assert run.engine_time_short(args, left_s=100) is None
    args = run.parse(["--out", "/tmp/unused", "--engine", "sim", "--min-engine-start-s", "120"])
    assert run.engine_time_short(args, left_s=100) is not None


def test_the_script_stops_at_once_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-P", str(SCRIPT), "--out", str(out), "--deadline-s", "120"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    log = (out / "progress.log").read_text()
    assert "FAILED at the start" in log and "--min-engine-start-s" in log
    assert "starting 2 engines" not in log
