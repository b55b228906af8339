"""`fleetgate bench cost`: naive serving vs FleetGate on a seeded, mixed, multi-tenant workload.

Runs the same workload (`fleetgate.bench.workload`) through the whole gateway pipeline once per
configuration — naive (no cache, round-robin, always the strong tier), each feature added alone,
then everything on — each on a fresh simulated two-tier fleet (`fleetgate.bench.cost_fleet`), and
prints a table with the quality guards beside each saving, plus JSON and a markdown report with
SVG plots.

`--throughput FILE` (repeatable) takes the engines' speed from measured throughput files
(`fleetgate.bench.cost_measured`) instead of the simulator's constants, and `--tier-entry TIER=SELECTOR`
picks a tier's entry explicitly (`fleetgate.bench.tier_entry`); the report says which tiers were measured
(on what) and which simulated.

`--lora` runs the LoRA comparison instead (`fleetgate.bench.cost_lora`): N fine-tunes as N deployments vs
N adapters on one shared base, with adapter-affinity and with adapter-blind routing, on a Zipf mix.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from fleetgate.bench.cost_fleet import TierDeployment, default_deployments
from fleetgate.bench.cost_report import score, table, targets, write_outputs
from fleetgate.bench.cost_run import CONFIGS, run_config
from fleetgate.bench.workload import generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=600, help="requests in the workload (default 600)")
    parser.add_argument("--rate", type=float, default=12.0, help="Poisson arrival rate, requests per simulated s")
    parser.add_argument("--seed", type=int, default=7)
    # Real time by default: the gateway's own CPU work (embedding, scoring) is not scaled, so a compressed
    # clock would inflate it relative to engine time and distort TTFT.
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="wall seconds per simulated second (default 1.0; below 1 runs faster, TTFT less faithful)")
    parser.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                        help="comma-separated subset of: " + ", ".join(c.name for c in CONFIGS))
    parser.add_argument("--out", type=Path, default=Path("artifacts/cost-report"), help="output folder")
    parser.add_argument("--throughput", type=Path, action="append", default=None,
                        help="a measured-throughput file (fleetgate.bench.measured_throughput: the GPU tier's or a "
                        "live routing run's throughput.json); repeat it to pool several files' entries. A tier "
                        "whose model shape has an unquantized entry (or the entry --tier-entry picks) runs at the "
                        "measured speed and is priced on its card; the others stay simulated (the report labels each)")
    parser.add_argument("--tier-entry", action="append", default=None, metavar="TIER=SELECTOR",
                        help="with --throughput: price TIER (small, large) from the one entry SELECTOR matches, "
                        "whatever its precision or parallelism: an entry name (e.g. large=llama70b-fp8-tp2) or "
                        "SHAPE/QUANTIZATION/tpN[/compiled|/eager] (e.g. large=llama-3.1-70b/fp8/tp2), optionally "
                        "@K for the K-th --throughput file; it takes the entry's card, GPUs per replica and price. "
                        "No match or several: exit 2")
    parser.add_argument("--usd-per-gpu-hour", type=float, default=None,
                        help="with --throughput: the measured GPU's hourly price (default: a list price by card)")
    lora = parser.add_argument_group("LoRA comparison (--lora)")
    lora.add_argument("--lora", action="store_true",
                      help="run N fine-tunes as N deployments vs N adapters on one base (affinity and blind routing)")
    lora.add_argument("--fine-tunes", type=int, default=8, help="fine-tunes in the mix (default 8)")
    lora.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the fine-tune popularity (default 1.1)")
    lora.add_argument("--max-loras", type=int, default=4, help="base engines' --max-loras (default 4)")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="base engines' --max-cpu-loras (default: --fine-tunes, every adapter fits host memory)")
    lora.add_argument("--target-utilisation", type=float, default=0.5,
                      help="sizing rule of every deployment: replicas for this share of full-batch work (default 0.5)")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _main_lora(args: argparse.Namespace) -> int:
    from fleetgate.bench.cost_lora import default_setup, size_layouts, sizing_table
    from fleetgate.bench.cost_lora_report import lora_table, lora_targets, score_lora, write_lora_outputs
    from fleetgate.bench.cost_lora_run import LORA_CONFIGS, run_lora_config
    from fleetgate.bench.workload import generate_lora

    if args.fine_tunes < 1 or args.max_loras < 1 or not 0 < args.target_utilisation <= 1:
        print("fleetgate bench cost --lora: --fine-tunes and --max-loras must be >= 1, --target-utilisation in (0, 1]",
              file=sys.stderr)
        return 2
    workload = generate_lora(seed=args.seed, requests=args.requests, rate_rps=args.rate, fine_tunes=args.fine_tunes,
                             zipf_s=args.zipf)
    setup = default_setup(time_scale=args.time_scale, fine_tunes=args.fine_tunes, max_loras=args.max_loras,
                          max_cpu_loras=args.max_cpu_loras, target_utilisation=args.target_utilisation)
    per_ft, shared = size_layouts(workload, setup)
    mix = workload.counts()
    _progress(f"workload: {len(workload.items)} requests over {workload.items[-1].at_s:.0f}s, seed {args.seed}, {mix}")
    _progress(f"sizing at {args.target_utilisation:.0%} utilisation: deployments {per_ft}, shared base {shared}")
    results = []
    for config in LORA_CONFIGS:
        started = time.perf_counter()
        _progress(f"running {config.name} ...")
        results.append(await run_lora_config(config, workload, setup, time_scale=args.time_scale, progress=_progress))
        _progress(f"  {config.name}: done in {time.perf_counter() - started:.1f}s wall")
    rows = [score_lora(r) for r in results]
    print(lora_table(rows))
    print()
    for name, met, figure in lora_targets(rows):
        print(f"{'met   ' if met else 'MISSED'}  {name}: {figure}")
    sizing = sizing_table(workload, setup)
    print("\nGPUs each layout needs as this mix's load grows (same sizing rule, no run):\n" + sizing)
    meta = {
        "command": "fleetgate bench cost " + " ".join(sys.argv[3:]),
        "seed": args.seed, "requests": args.requests, "rate_rps": args.rate, "time_scale": args.time_scale,
        "fine_tunes": args.fine_tunes, "zipf": args.zipf, "mix": mix,
        "replicas": {"deployments": per_ft, "shared_base": shared},
        "engine": {"profile": setup.profile.name, "gpu": setup.gpu_type, "gpus_per_replica": setup.gpus_per_replica,
                   "usd_per_gpu_hour": setup.usd_per_gpu_hour, "max_loras": setup.max_loras,
                   "max_cpu_loras": setup.max_cpu_loras, "target_utilisation": setup.target_utilisation},
    }
    paths = write_lora_outputs(rows, meta=meta, sizing=sizing, out_dir=args.out)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.errors == 0 for r in rows) else 1


def _measured(
    args: argparse.Namespace, deployments: tuple[TierDeployment, ...]
) -> tuple[tuple[TierDeployment, ...], dict[str, str]]:
    """The deployments and labels from every --throughput file and the --tier-entry selectors."""
    from fleetgate.bench.cost_measured import apply_throughput
    from fleetgate.bench.measured_throughput import ThroughputFileError, load
    from fleetgate.bench.tier_entry import merge, parse_tier_entries

    files = []
    for path in args.throughput or []:
        try:
            files.append((str(path), load(path)))
        except (OSError, ThroughputFileError) as exc:
            raise ValueError(f"--throughput {path}: {exc}") from None
    selectors = parse_tier_entries(args.tier_entry or [], tiers=[d.tier for d in deployments])
    return apply_throughput(deployments, merge(files), tier_entries=selectors, usd_per_gpu_hour=args.usd_per_gpu_hour)


async def _main(args: argparse.Namespace) -> int:
    if args.lora:
        return await _main_lora(args)
    wanted = [c for c in CONFIGS if c.name in set(args.configs.split(","))]
    if not wanted or wanted[0].name != "naive":
        print("fleetgate bench cost: the configurations must include `naive` (the baseline)", file=sys.stderr)
        return 2
    workload = generate(seed=args.seed, requests=args.requests, rate_rps=args.rate)
    deployments: tuple[TierDeployment, ...] = default_deployments(time_scale=args.time_scale)
    labels = {d.tier: f"simulated (profile {d.profile.name})" for d in deployments}
    if args.tier_entry and not args.throughput:
        print("fleetgate bench cost: --tier-entry needs --throughput", file=sys.stderr)
        return 2
    if args.throughput:
        try:
            deployments, labels = _measured(args, deployments)
        except (OSError, ValueError) as exc:  # ThroughputFileError and SelectorError are ValueErrors
            print(f"fleetgate bench cost: {exc}", file=sys.stderr)
            return 2
    measured = [v.startswith("measured") for v in labels.values()]
    mode = "measured" if all(measured) else "partly measured" if any(measured) else "simulated"
    _progress(f"throughput: {mode}; " + "; ".join(f"{tier} tier {label}" for tier, label in labels.items()))
    _progress(f"workload: {len(workload.items)} requests, seed {args.seed}, {workload.counts()}")
    results = []
    for config in wanted:
        started = time.perf_counter()
        _progress(f"running {config.name} ...")
        result = await run_config(config, workload, deployments, time_scale=args.time_scale, progress=_progress)
        _progress(f"  {config.name}: done in {time.perf_counter() - started:.1f}s wall")
        results.append(result)
    rows = [score(r) for r in results]
    print(f"engine throughput: {mode}")
    for tier, label in labels.items():
        print(f"  {tier} tier: {label}")
    print(table(rows))
    if any(r.config == "all-on" for r in rows):
        print()
        for name, met, figure in targets(rows):
            print(f"{'met   ' if met else 'MISSED'}  {name}: {figure}")
    meta = {
        "command": "fleetgate bench cost " + " ".join(sys.argv[3:]),
        "seed": args.seed, "requests": args.requests, "rate_rps": args.rate, "time_scale": args.time_scale,
        "mix": workload.counts(),
        "throughput_mode": mode,
        "deployments": [{"tier": d.tier, "model": d.model, "replicas": d.replicas, "gpu": d.gpu_type,
                         "gpus_per_replica": d.gpus_per_replica, "usd_per_gpu_hour": d.usd_per_gpu_hour,
                         "throughput": labels[d.tier]}
                        for d in deployments],
    }
    paths = write_outputs(rows, meta=meta, out_dir=args.out)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.errors == 0 for r in rows) else 1


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))
