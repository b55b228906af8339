"""`fleetgate bench routing --live`: the live routing benchmark's command-line options and entry point.

Against running engines (`--urls`, e.g. vLLM replicas started with `VLLM_SERVER_DEV_MODE=1` so their
prefix caches can be reset between points), or, without `--urls`, against `--sim-replicas` simulated
engines started here in their own process (`fleetgate sim`). Results go to `--out` (`results.jsonl`,
then `report.md` and `throughput.json` from `fleetgate.bench.live_report`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetgate.bench.live_gateway import http_ok
from fleetgate.bench.live_routing import LiveOptions, run_live, stamp
from fleetgate.sim.workloads import Sizes


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("live routing benchmark (--live)")
    g.add_argument("--profiles", default="round-robin,least-loaded,default,precise-prefix",
                   help="routing profiles of the shared-prefix points (a name without a preset or --profile-config "
                   "is reported as unavailable and skipped)")
    g.add_argument("--profile-config", action="append", default=[], metavar="NAME=PATH",
                   help="a routing YAML for profile NAME (may use ${ENGINE_URLS}, ${KV_EVENTS_ENDPOINTS}, "
                   "${MODEL_DIR}, ${BLOCK_SIZE})")
    g.add_argument("--loads", default="1.5,1.0,0.5", help="shared-prefix loads, multiples of round-robin's "
                   "capacity, in priority order (the first two get the long window)")
    g.add_argument("--unique-loads", default="0.8")
    g.add_argument("--unique-profiles", default="least-loaded,default,round-robin")
    g.add_argument("--chat-loads", default="1.0")
    g.add_argument("--chat-users", type=int, default=48, help="chat users at load 1.0")
    g.add_argument("--chat-profiles", default="round-robin,least-loaded,default")
    g.add_argument("--window", type=float, default=10.0, help="seconds of offered load per point (first two loads)")
    g.add_argument("--short-window", type=float, default=8.0, help="seconds per point for the other points")
    g.add_argument("--drain", type=float, default=20.0, help="most seconds a point waits for its backlog")
    g.add_argument("--overhead-window", type=float, default=12.0)
    g.add_argument("--overhead-profiles", default="default", help="routing profiles of the overhead phase "
                   "(comma-separated; each once per --overhead-replicas count, profile by profile)")
    g.add_argument("--overhead-background", choices=["shared-prefix", "reference"], default="shared-prefix",
                   help="the overhead phase's background load: shared-prefix (that workload at the base rate, open "
                   "loop) or reference (issue 24's scale: --overhead-streams closed-loop streams per engine, each "
                   "sending unique ~1k-token prompts for 128 output tokens, one after another)")
    g.add_argument("--overhead-streams", type=_positive, default=64,
                   help="the reference background's streams per engine")
    g.add_argument("--overhead-controls", default="", help="control pairs beside the gateway's: two direct "
                   "requests, the second sent this many ms later (comma-separated), what the paired probe charges a "
                   "known pure delay")
    g.add_argument("--accounting-cancel-share", type=float, default=0.3)
    g.add_argument("--accounting-finish-tokens", type=int, default=0,
                   help="> 0: a second accounting row with the gateway's server.cancel_finish_tokens at this value")
    g.add_argument("--probe-seconds", type=float, default=10.0, help="the capacity probe's closed loop")
    g.add_argument("--probe-concurrency", type=int, default=0, help="its streams (default 96 per engine)")
    g.add_argument("--base-rate", type=float, default=None, help="skip the capacity probe: round-robin's capacity")
    g.add_argument("--no-calibrate", action="store_true", help="skip the TTFT/TPOT probe")
    g.add_argument("--calibration-lengths", default="128,512,1024,2048,4096")
    g.add_argument("--calibration-batches", default="1,16,64,128")
    g.add_argument("--calibration-reps", type=int, default=3)
    g.add_argument("--budget", type=float, default=400.0, help="seconds for the whole run (points that would not "
                   "fit are skipped)")
    g.add_argument("--live-seed", type=int, default=24)
    g.add_argument("--repeat-seeds", default="", help="more seeds for the first load's shared-prefix points (each "
                   "profile again on other requests, reported as their own group)")
    g.add_argument("--no-accounting", action="store_true", help="no accounting row (--overhead-window 0: no "
                   "overhead phase)")
    g.add_argument("--question-tokens", type=int, default=96)
    g.add_argument("--output-tokens", type=int, default=64)
    g.add_argument("--hot-factor", type=float, default=None, help="hot prefixes / one engine's KV (default "
                   "min(2.5, 0.75 x replicas))")
    g.add_argument("--tenants", type=int, default=8)
    g.add_argument("--kv-events", default="", help="the engines' KV-event publishers (comma-separated, engine order)")
    g.add_argument("--kv-replays", default="", help="their replay addresses (comma-separated, engine order)")
    g.add_argument("--kv-topic", default="kv-events", help="the topic they publish on")
    g.add_argument("--model-dir", default="", help="the engines' model directory (for ${MODEL_DIR})")
    g.add_argument("--epp-loads", default="", help="issue 27, after every other point: shared-prefix loads run "
                   "through the gateway and through Envoy + `fleetgate epp` for each --epp-profiles (default: none)")
    g.add_argument("--epp-profiles", default="least-loaded,default", help="profiles of those points (the gain is "
                   "the last over the first)")
    g.add_argument("--epp-window", type=float, default=None, help="seconds per door point (default --short-window)")
    g.add_argument("--epp-latency-window", type=float, default=10.0, help="the door-latency phase's loaded window "
                   "(0: no such phase)")
    g.add_argument("--epp-idle-rounds", type=int, default=24, help="its probe rounds on idle engines")
    g.add_argument("--epp-site", default="", help="a site directory first on the picker's path (the GPU "
                   "machine's gRPC packages, scripts/gpu/pack_epp.py)")
    g.add_argument("--py-spy-dir", type=Path, default=None, help="py-spy samples of each gateway point's window "
                   "go here (py-spy on PATH or in $FLEETGATE_PY_SPY; python -m fleetgate.bench.live_pyspy sums them)")
    g.add_argument("--gateway-replicas", type=int, default=1, help="gateway processes per door, sharing one "
                   "redis-server started for the door ($FLEETGATE_REDIS_SERVER or PATH): requests and probes go to "
                   "them in turn, the door's CPU is their sum")
    g.add_argument("--overhead-replicas", default="", help="run the overhead phase once per gateway count given "
                   "(comma-separated, same requests; counts > 1 share a redis-server), e.g. 1,2")
    g.add_argument("--gateway-redis", action="store_true", help="the gateways' state in that Redis even with one "
                   "replica (to tell the shared state's cost from the split's gain)")
    g.add_argument("--out", type=Path, default=Path("artifacts/live-routing"), help="output folder")
    g.add_argument("--sim-replicas", type=int, default=2, help="without --urls: simulated engines to start")
    g.add_argument("--sim-kv-blocks", type=int, default=1024)
    g.add_argument("--sim-time-scale", type=float, default=1.0)


def options_from_args(args: argparse.Namespace) -> LiveOptions:
    configs = {}
    for item in args.profile_config:
        name, _, path = item.partition("=")
        if not name or not path:
            raise SystemExit(f"--profile-config wants NAME=PATH, got {item!r}")
        configs[name] = Path(path)
    sizes = Sizes(prefix_tokens=args.prefix_tokens or 2048, question_tokens=args.question_tokens,
                  output_tokens=args.output_tokens, hot_factor=args.hot_factor, tenants=args.tenants)
    return LiveOptions(
        profiles=_names(args.profiles), profile_configs=configs, loads=_floats(args.loads), window_s=args.window,
        short_window_s=args.short_window, drain_s=args.drain, unique_loads=_floats(args.unique_loads),
        unique_profiles=_names(args.unique_profiles), chat_loads=_floats(args.chat_loads), chat_users=args.chat_users,
        chat_profiles=_names(args.chat_profiles), accounting_cancel_share=args.accounting_cancel_share,
        accounting_finish_tokens=args.accounting_finish_tokens,
        overhead_profiles=_names(args.overhead_profiles),
        overhead_window_s=args.overhead_window, overhead_controls_ms=tuple(_floats(args.overhead_controls)),
        overhead_background=args.overhead_background, overhead_streams=args.overhead_streams,
        probe_s=args.probe_seconds, probe_concurrency=args.probe_concurrency,
        base_rate=args.base_rate, calibrate=not args.no_calibrate,
        calibration_lengths=tuple(int(x) for x in _floats(args.calibration_lengths)),
        calibration_batches=tuple(int(x) for x in _floats(args.calibration_batches)),
        calibration_reps=args.calibration_reps, budget_s=args.budget,
        seed=args.live_seed, repeat_seeds=[int(x) for x in _floats(args.repeat_seeds)],
        accounting=not args.no_accounting, sizes=sizes, kv_tokens=args.kv_tokens, kv_events=_names(args.kv_events),
        kv_replays=_names(args.kv_replays), kv_topic=args.kv_topic,
        model_dir=args.model_dir, epp_loads=_floats(args.epp_loads), epp_profiles=_names(args.epp_profiles),
        epp_window_s=args.epp_window, epp_latency_window_s=args.epp_latency_window,
        epp_idle_rounds=args.epp_idle_rounds, epp_latency_profile=_names(args.epp_profiles)[-1] if
        _names(args.epp_profiles) else "default", epp_site=args.epp_site, py_spy_dir=args.py_spy_dir,
        gateway_replicas=args.gateway_replicas, gateway_redis=args.gateway_redis,
        overhead_replicas=tuple(int(x) for x in _floats(args.overhead_replicas)),
    )


@contextmanager
def sim_engines(*, replicas: int, kv_blocks: int, time_scale: float, log_dir: Path) -> Iterator[list[str]]:
    """`replicas` simulated engines (profile gpu-8b) in a child process, on loopback ports the child binds itself
    (`--base-port 0`) and prints: a port picked here and bound there later can be taken in between (by any
    outgoing connection's ephemeral port), which made a busy test run fail with "address already in use"."""
    argv = [sys.executable, "-m", "fleetgate", "sim", "--replicas", str(replicas), "--base-port", "0",
            "--profile", "gpu-8b", "--kv-blocks", str(kv_blocks), "--time-scale", str(time_scale),
            "--model", "llama-3.1-8b"]
    log_path = log_dir / "sim-engines.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed below, after the child)
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        urls: list[str] = []
        while len(urls) < replicas or not all(http_ok(u + "/health") for u in urls):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulated engines did not start: {log_path.read_text()}")
            time.sleep(0.1)
            urls = SERVING.findall(log_path.read_text())
        yield urls
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


SERVING = re.compile(r"^sim engine serving .* at (http://\S+)/v1 ", re.MULTILINE)  # fleetgate.sim.serve's line


def run_live_cli(args: argparse.Namespace) -> int:
    from fleetgate.bench.live_report import write_reports

    options = options_from_args(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleetgate-live-") as tmp:
        work = Path(tmp)
        if args.urls:
            urls = [u.strip().rstrip("/").removesuffix("/v1") for u in args.urls.split(",") if u.strip()]
            rows = asyncio.run(run_live(urls, options, out_dir=out, workdir=work))
        else:
            with sim_engines(replicas=args.sim_replicas, kv_blocks=args.sim_kv_blocks, time_scale=args.sim_time_scale,
                             log_dir=work) as urls:
                stamp(f"simulated engines at {urls}")
                rows = asyncio.run(run_live(urls, options, out_dir=out, workdir=work))
    paths = write_reports(rows, out_dir=out, engine=(args.urls and "live engines") or "simulated engines (gpu-8b)")
    stamp("wrote " + ", ".join(str(p) for p in paths))
    verdict = next((r.get("verdict") for r in rows if r.get("kind") == "accounting"), "FAIL")
    return 0 if verdict == "PASS" else 1
