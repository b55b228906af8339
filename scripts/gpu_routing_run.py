#!/usr/bin/env python3
"""The whole GPU routing experiment of issue 24 in one process, for one device call.

On the GPU machine (fleetgate not installed; vLLM from the kit on PYTHONPATH), from the repository root:

    source .gpu-kit/install.sh .gpu-kit || exit; python3 -P scripts/gpu_routing_run.py --out $OUT \
        --started-at-pid $$ --deadline-s 545

1. assembles the package tree (`scripts/static_checks.py`'s `assemble()`) and puts `build/tree` on the
   path of this process and of every child (the gateways);
2. writes the model directory: the shape's `config.json` (`fleetgate.bench.gpu.models`, the GPU tier's
   Llama 3.1 8B with the Gemma vocabulary) and the Gemma 3 tokenizer carried as `--tokenizer-archive`
   (`build/gpu/gemma3-tokenizer.tar.xz`, made here by `scripts/gpu/pack_tokenizer.py`);
3. starts `--replicas` vLLM engines at once (`--load-format dummy`, one GPU each, round-robin over the
   GPUs, `VLLM_SERVER_DEV_MODE=1` for `/reset_prefix_cache`, the KV cache capped at `--kv-blocks` blocks so
   that the shared-prefix workload saturates it within seconds, `PYTHONHASHSEED=0`, KV events published
   when a profile needs them) and waits for them;
4. runs the live benchmark (`fleetgate.bench.live_routing.run_live`) with what is left of the deadline,
   writing `results.jsonl` row by row;
5. writes `report.md`, `throughput.json`, `run-info.json`, `engines.log` (the lines of each engine's log
   that matter, and its tail) and `gateways.log` (tails of the gateways' logs), and stops the engines.
Every step prints a stamped line (also kept in `progress.log`). Nothing runs past `--deadline-s` seconds
after `--started-at` but the final writing and the engines' stop (about 20 s).

With `--epp-loads` (issue 27, `fleetgate.bench.live_epp`) the run ends with the shared-prefix workload through the
gateway and through a real Envoy asking `fleetgate epp`, and the door-latency phase; on the GPU machine source
`scripts/gpu/epp_site.sh` first and pass `--epp-site "$EPP_SITE"` (the picker's gRPC packages, first on the path of
the picker and of this process, not of the engines). A picker that cannot start drops those points, not the run.

With `--gateway-replicas N` (N > 1) every gateway door is N gateway processes sharing a redis-server: on the GPU
machine source `scripts/gpu/redis_site.sh` first (it unpacks `build/gpu/redis.tar.xz`, made here by
`scripts/gpu/pack_redis.py`, and exports `FLEETGATE_REDIS_SERVER`); without a redis-server the run stops at once,
before any engine starts, and the preflight starts each profile's door with its replicas and Redis.

`--engine vllm-cpu` runs the same on the local vLLM CPU engine serving the prepared Gemma 3 270M (a dry
run of the mechanics); `--engine sim` on simulated engines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
KV_LINES = ("KV cache", "Maximum concurrency", "memory", "Memory", "CUDA graph", "torch.compile", "Error", "ERROR",
            "Traceback", "weights", "Starting vLLM", "non-default args", "Available", "init engine")


class Tee:
    """stdout to the terminal and to a file."""

    def __init__(self, stream: TextIO, path: Path) -> None:
        self.stream = stream
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (lives as long as the process)

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()


def stamp(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def raise_open_files() -> None:
    """Hundreds of streams at once hold a socket each in the client and two in the gateway: lift the soft
    limit on open files to the hard one (children inherit it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def assemble_tree() -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    from static_checks import assemble

    tree = assemble()
    sys.path.insert(0, str(tree))
    os.environ["PYTHONPATH"] = f"{tree}{os.pathsep}{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") \
        else str(tree)
    os.environ["PYTHONSAFEPATH"] = "1"
    return tree


def process_start(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc; None when it cannot be read."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def gpu_info() -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"gpus": 0, "card": "none"}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"gpus": 0, "card": "unknown"}
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    name = lines[0].split(",")[0].strip() if lines else "unknown"
    return {"gpus": len(lines), "card": name, "nvidia_smi": lines}


def engine_version() -> str:
    """The installed vLLM's version from its metadata (importing vLLM would take seconds)."""
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm ?"


def vllm_specs(args: argparse.Namespace, *, model_dir: Path, served: str, workdir: Path, gpus: int,
               kv_events: bool) -> tuple[list[Any], list[str], list[str]]:
    from fleetgate.engine.args import VLLM_MODULE, EngineArgs, KvEventsArgs
    from fleetgate.local.engines import EngineSpec, free_port

    specs, publishers, replays = [], [], []
    cpu = args.engine == "vllm-cpu"
    for i in range(args.replicas):
        port = free_port()
        extra = ["--disable-uvicorn-access-log"]
        if not cpu:
            extra += ["--load-format", "dummy", "--num-gpu-blocks-override", str(args.kv_blocks)]
        kv = None
        if kv_events:
            # ipc sockets: vLLM binds an ipc:// address (a tcp://127.0.0.1 one it would *connect* to, and nothing
            # would listen), the gateway connects to the same string, and nothing listens on the network.
            base = workdir.resolve() / f"engine-{i}"
            kv = KvEventsArgs(endpoint=f"ipc://{base}.kv", replay_endpoint=f"ipc://{base}.kv-replay", topic="kv-events")
            publishers.append(kv.endpoint)
            replays.append(str(kv.replay_endpoint))
        eargs = EngineArgs(model=str(model_dir), served_model_name=served, port=port,
                           dtype="bfloat16", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=None if cpu else args.max_num_batched_tokens,
                           gpu_memory_utilization=None if cpu else args.gpu_memory_utilization,
                           enable_prefix_caching=True, enforce_eager=cpu, kv_events=kv, extra_args=extra)
        env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
               "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(workdir / f"vllm-cache-{i}")}
        if cpu:
            env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"})
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(i % max(1, gpus))
        specs.append(EngineSpec(name=f"engine-{i}", argv=[sys.executable, "-m", VLLM_MODULE, *eargs.to_argv()],
                                env=env, url=f"http://127.0.0.1:{port}", log_path=workdir / f"engine-{i}.log",
                                expect_model=served))
    return specs, publishers, replays


def digest_logs(paths: list[Path], *, tail: int = 60) -> str:
    parts = []
    for path in paths:
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        keep = [ln for ln in lines if any(k in ln for k in KV_LINES)][:200]
        parts.append(f"===== {path.name}: {len(lines)} lines; the ones that matter =====\n" + "\n".join(keep))
        parts.append(f"----- {path.name}: last {tail} lines -----\n" + "\n".join(lines[-tail:]))
    return "\n".join(parts) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    from fleetgate.bench.live_cli import add_live_arguments

    parser = argparse.ArgumentParser(prog="gpu_routing_run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--started-at", type=float, default=None, help="the call's start (epoch s); default: now")
    parser.add_argument("--started-at-pid", type=int, default=None,
                        help="the call's start is this process's start (pass the device shell's $$)")
    parser.add_argument("--deadline-s", type=float, default=550.0, help="end of the benchmark, from --started-at")
    parser.add_argument("--tail-s", type=float, default=25.0, help="kept for the report and the engines' stop")
    parser.add_argument("--engine", choices=["vllm", "vllm-cpu", "sim"], default="vllm")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--tokenizer-archive", type=Path, default=ROOT / "build" / "gpu" / "gemma3-tokenizer.tar.xz",
                        help="the Gemma 3 tokenizer packed by scripts/gpu/pack_tokenizer.py (a carry path)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="--num-gpu-blocks-override per engine")
    parser.add_argument("--startup-timeout", type=float, default=330.0)
    parser.add_argument("--min-engine-start-s", type=float, default=None,
                        help="stop at once, before any engine starts, when the deadline leaves the engines less than "
                             "this to start (default: 150 s for --engine vllm, 0 otherwise; 0 disables the check)")
    parser.add_argument("--prefix-tokens", type=int, default=None, help="shared prefix length (default 2048)")
    parser.add_argument("--kv-tokens", type=int, default=None, help="one engine's KV capacity (default: reported)")
    add_live_arguments(parser)  # the options of `fleetgate bench routing --live`
    args = parser.parse_args(argv)
    args.live = True
    return args


def preflight(workdir: Path, profiles: list[str], configs: dict[str, Path], *, model_dir: str = "",
              replicas: int = 1, redis_server: str | None = None) -> None:
    """Before any engine starts: a gateway of every profile this build has boots (imports, config, server),
    so a missing package or a bad routing file costs seconds, not an engine start-up. `model_dir` (the engines'
    model directory, known before they start) fills `${MODEL_DIR}`, so a profile with the tokenizer in the gateway
    loads the real one here (an empty path made it log a failed load, `Repo id must use alphanumeric chars`)."""
    from fleetgate.bench.live_gateway import Keys, resolve_profile
    from fleetgate.bench.live_replicas import start_gateways
    from fleetgate.core.errors import ConfigError

    keys = Keys.make(1)
    for name in profiles:
        try:
            variables = {"ENGINE_URLS": "[]", "KV_EVENTS_ENDPOINTS": "[]", "MODEL_DIR": model_dir, "BLOCK_SIZE": "16"}
            profile = resolve_profile(name, configs=configs, variables=variables)
        except ConfigError:
            continue  # reported (and skipped) by the run
        # > tokenizerLoadTimeoutS (120 s), after which a gateway is ready anyway
        gateway = start_gateways(profile, replicas=replicas, redis_binary=redis_server, model="preflight",
                                 urls=["http://127.0.0.1:9"], keys=keys, workdir=workdir, timeout_s=180)
        gateway.stop()
        shared = f" x{replicas} sharing {redis_server}" if redis_server else ""
        stamp(f"preflight: the {name} gateway{shared} starts ({gateway.started_s:.1f}s)")


def epp_preflight(workdir: Path, options: Any) -> None:
    """With door points (`--epp-loads`): Envoy's binary is there and a picker of the latency profile starts (its
    gRPC packages from `--epp-site`). When not, the door points are dropped with the reason, and the rest of the
    run goes on."""
    if not options.epp_loads:
        return
    name = options.epp_latency_profile
    try:
        from fleetgate.bench.live_epp import picker_preflight  # the xds protos: from --epp-site on the GPU machine
        from fleetgate.bench.live_gateway import resolve_profile

        variables = {"ENGINE_URLS": "[]", "KV_EVENTS_ENDPOINTS": "[]", "MODEL_DIR": "", "BLOCK_SIZE": "16"}
        took = picker_preflight(workdir, resolve_profile(name, configs=options.profile_configs, variables=variables),
                                epp_site=options.epp_site)
    except Exception as exc:  # the gateway's points must not depend on the picker's packages
        stamp(f"preflight: NO Envoy + EPP door points: {exc}")
        options.epp_loads = []
        return
    stamp(f"preflight: the {name} Endpoint Picker starts ({took:.1f}s); Envoy is installed")


async def _run(urls: list[str], options: Any, out: Path, workdir: Path) -> list[dict[str, Any]]:
    from fleetgate.bench.live_routing import run_live

    return await run_live(urls, options, out_dir=out, workdir=workdir)


# The 8B-shaped engines took 73-165 s to become healthy on the GPU machines (compiling, CUDA graphs; a fresh machine is
# the slow end): a deadline that leaves less spends the device time on a start that is then killed (run 8e).
GPU_ENGINE_START_S = 150.0


def engine_start_room(args: argparse.Namespace, *, left_s: float) -> float:
    """The seconds the engines are given to start when `left_s` remain to the deadline: what the run still needs after
    them (its tail and a minute of measuring) comes off first."""
    return min(args.startup_timeout, left_s - args.tail_s - 60)


def engine_time_short(args: argparse.Namespace, *, left_s: float) -> str | None:
    """Why the deadline cannot fit the engines' start (`--min-engine-start-s`), or None when it can."""
    need = args.min_engine_start_s
    if need is None:
        need = GPU_ENGINE_START_S if args.engine == "vllm" else 0.0
    room = engine_start_room(args, left_s=left_s)
    if need <= 0 or room >= need:
        return None
    return (f"the deadline leaves the engines {room:.0f}s to start (--deadline-s minus --tail-s minus 60 s), less "
            f"than the {need:.0f}s they need (--min-engine-start-s); raise --deadline-s, or pass "
            f"--min-engine-start-s 0 to try anyway")


def main(argv: list[str]) -> int:
    out = Path(next((argv[i + 1] for i, a in enumerate(argv) if a == "--out"), "artifacts/gpu-routing"))
    out.mkdir(parents=True, exist_ok=True)
    sys.stdout = Tee(sys.stdout, out / "progress.log")  # type: ignore[assignment]
    raise_open_files()
    assemble_tree()
    args = parse(argv)
    started = args.started_at or (process_start(args.started_at_pid) if args.started_at_pid else None) or time.time()
    deadline = started + args.deadline_s
    stamp(f"gpu_routing_run: engine {args.engine}, {args.replicas} replicas; {time.time() - started:.0f}s since the "
          f"call started, {deadline - time.time():.0f}s to the deadline; package tree on PYTHONPATH")

    from fleetgate.bench.live_cli import options_from_args, sim_engines
    from fleetgate.bench.live_gateway import resolve_profile
    from fleetgate.bench.live_replicas import require_redis
    from fleetgate.bench.live_report import write_reports
    from fleetgate.core.errors import ConfigError
    from fleetgate.local.engines import EngineFleet

    options = options_from_args(args)
    short = engine_time_short(args, left_s=deadline - time.time())
    if short:
        stamp(f"FAILED at the start: {short}")
        return 2
    try:
        redis_server = require_redis(max((options.gateway_replicas, *options.overhead_replicas)),
                                     redis=options.gateway_redis)
    except ConfigError as exc:  # before any engine starts
        stamp(f"FAILED at the start: {exc}")
        return 2
    wants_events = False
    if "precise-prefix" in options.profiles and "precise-prefix" not in options.profile_configs:
        try:
            resolve_profile("precise-prefix", configs={}, variables={})
            wants_events = True
        except ConfigError:
            stamp("profile precise-prefix: no such preset in this build; it will be skipped")
    wants_events = wants_events or bool(options.profile_configs)
    info: dict[str, Any] = {"engine": args.engine, "replicas": args.replicas, "max_num_seqs": args.max_num_seqs,
                            "max_num_batched_tokens": args.max_num_batched_tokens, "model_shape": args.shape,
                            "dtype": "bfloat16", "quantization": "none", "kv_cache_dtype": "auto",
                            "enforce_eager": False, "kv_blocks": args.kv_blocks, "started_at": started, "argv": argv,
                            "gateway_replicas": options.gateway_replicas, "redis_server": redis_server}
    workdir = Path(tempfile.mkdtemp(prefix="gpu-routing-"))
    fleet: EngineFleet | None = None
    rows: list[dict[str, Any]] = []
    every_profile = list(dict.fromkeys([*options.profiles, *options.unique_profiles, *options.chat_profiles,
                                        *(options.epp_profiles if options.epp_loads else [])]))
    if options.epp_site:
        # the picker's gRPC packages: first on this process's path (the doors' Envoy bootstrap imports the xds
        # protos), not on the engines' (their environment keeps the machine's own packages)
        options.epp_site = str(Path(options.epp_site).resolve())
        sys.path.insert(0, options.epp_site)
    try:
        if args.engine == "sim":
            preflight(workdir, every_profile, options.profile_configs, model_dir=options.model_dir,
                      replicas=options.gateway_replicas, redis_server=redis_server)
            epp_preflight(workdir, options)
            info.update(engine_desc="simulated engines (gpu-8b profile)", card="simulated", enforce_eager=True)
            options.budget_s = min(options.budget_s, deadline - time.time() - args.tail_s)
            with sim_engines(replicas=args.replicas, kv_blocks=args.kv_blocks, time_scale=1.0,
                             log_dir=workdir) as urls:
                rows = asyncio.run(_run(urls, options, out, workdir))
        else:
            gpus = gpu_info()
            info.update(gpus)
            info["engine_version"] = engine_version()
            info["vllm_version"] = info["engine_version"].split(" ", 1)[-1]
            stamp(f"GPUs: {gpus.get('nvidia_smi', gpus)}; {info['engine_version']}")
            if args.engine == "vllm":
                from fleetgate.bench.gpu.models import model_config, prepare_models, unpack_tokenizer
                from fleetgate.engine.hf_config import parameter_count

                tokenizer = unpack_tokenizer(archive=args.tokenizer_archive, folder=workdir / "tokenizer")
                dirs = prepare_models(root=workdir / "models", tokenizer_dir=tokenizer, names=[args.shape])
                model_dir = dirs[args.shape]
                info["parameters"] = parameter_count(model_config(args.shape))
                served = args.shape
            else:
                from fleetgate.local.model_prep import prepare_model

                model_dir, served = prepare_model(), "gemma-3-270m"
                info.update(model_shape="gemma-3-270m", card="cpu", enforce_eager=True)
            options.model_dir = str(model_dir)
            specs, publishers, replays = vllm_specs(args, model_dir=model_dir, served=served, workdir=workdir,
                                                    gpus=int(gpus.get("gpus") or 1), kv_events=wants_events)
            options.kv_events, options.kv_replays = publishers, replays
            info["engine_desc"] = (f"{info['engine_version']}, {args.replicas}x {served} "
                                   f"({'dummy weights, ' if args.engine == 'vllm' else ''}bf16) on {info.get('card')}")
            timeout = engine_start_room(args, left_s=deadline - time.time())
            fleet = EngineFleet(specs=specs, startup_timeout_s=timeout, progress=stamp, poll_s=1.0)
            stamp(f"starting {len(specs)} engines (timeout {timeout:.0f}s): {' '.join(specs[0].argv[1:])}")
            fleet.launch()
            # while the engines start; a failure stops them
            preflight(workdir, every_profile, options.profile_configs, model_dir=options.model_dir,
                      replicas=options.gateway_replicas, redis_server=redis_server)
            epp_preflight(workdir, options)
            waited = fleet.wait_healthy()
            info["engine_startup_s"] = waited
            stamp(f"engines ready after {waited:.0f}s; {deadline - time.time():.0f}s to the deadline")
            options.budget_s = min(options.budget_s, deadline - time.time() - args.tail_s)
            rows = asyncio.run(_run([s.url for s in specs], options, out, workdir))
    except BaseException as exc:  # keep what ran; say what broke
        stamp(f"FAILED: {exc!r}\n{traceback.format_exc()}")
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        try:
            results = out / "results.jsonl"
            if results.is_file() and not rows:
                rows = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()]
            info["source"] = f"scripts/gpu_routing_run.py {' '.join(argv)} ({time.strftime('%Y-%m-%d')})"
            (out / "run-info.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
            if rows:
                for path in write_reports(rows, out_dir=out, engine=str(info.get("engine_desc", "")), info=info):
                    stamp(f"wrote {path}")
            (out / "engines.log").write_text(digest_logs(sorted(workdir.glob("engine-*.log"))))
            gateway_logs = sorted(workdir.glob("gateway-*.log"))
            (out / "gateways.log").write_text(digest_logs(gateway_logs, tail=15) if gateway_logs else "no gateway\n")
        finally:
            if fleet is not None:
                stamp("stopping the engines")
                fleet.stop()
            stamp(f"done, {time.time() - started:.0f}s after the start")
    verdict = next((r.get("verdict") for r in rows if r.get("kind") == "accounting"), None)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
