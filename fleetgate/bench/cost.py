"""`fleetgate bench cost`: naive serving vs FleetGate on a seeded, mixed, multi-tenant workload.

Runs the same workload (`fleetgate.bench.workload`) through the whole gateway pipeline once per
configuration — naive (no cache, round-robin, always the strong tier), each feature added alone,
then everything on — each on a fresh simulated two-tier fleet (`fleetgate.bench.cost_fleet`), and
prints a table with the quality guards beside each saving, plus JSON and a markdown report with
SVG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from fleetgate.bench.cost_fleet import default_deployments
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


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _main(args: argparse.Namespace) -> int:
    wanted = [c for c in CONFIGS if c.name in set(args.configs.split(","))]
    if not wanted or wanted[0].name != "naive":
        print("fleetgate bench cost: the configurations must include `naive` (the baseline)", file=sys.stderr)
        return 2
    workload = generate(seed=args.seed, requests=args.requests, rate_rps=args.rate)
    deployments = default_deployments(time_scale=args.time_scale)
    _progress(f"workload: {len(workload.items)} requests, seed {args.seed}, {workload.counts()}")
    results = []
    for config in wanted:
        started = time.perf_counter()
        _progress(f"running {config.name} ...")
        result = await run_config(config, workload, deployments, time_scale=args.time_scale, progress=_progress)
        _progress(f"  {config.name}: done in {time.perf_counter() - started:.1f}s wall")
        results.append(result)
    rows = [score(r) for r in results]
    print(table(rows))
    if any(r.config == "all-on" for r in rows):
        print()
        for name, met, figure in targets(rows):
            print(f"{'met   ' if met else 'MISSED'}  {name}: {figure}")
    meta = {
        "command": "fleetgate bench cost " + " ".join(sys.argv[3:]),
        "seed": args.seed, "requests": args.requests, "rate_rps": args.rate, "time_scale": args.time_scale,
        "mix": workload.counts(),
        "deployments": [{"tier": d.tier, "model": d.model, "replicas": d.replicas, "gpu": d.gpu_type,
                         "gpus_per_replica": d.gpus_per_replica, "usd_per_gpu_hour": d.usd_per_gpu_hour}
                        for d in deployments],
    }
    paths = write_outputs(rows, meta=meta, out_dir=args.out)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.errors == 0 for r in rows) else 1


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))
