"""`fleetgate bench <name>`: each benchmark is a module with `add_arguments` and `run`.

Modules are imported only when chosen, like the top-level commands. `fleetgate bench engine --gpu` runs the
GPU tier's sweep (`fleetgate.bench.gpu.sweep`) instead of the local CPU engine benchmark.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "gateway": ("fleetgate.bench.gateway_overhead", "gateway added latency and RPS vs direct-to-engine"),
    "embedder": ("fleetgate.bench.embedder", "MiniLM backends: agreement with the reference and CPU per text"),
    "routing": ("fleetgate.bench.routing", "endpoint-picking policies on the simulated fleet"),
    "precise-prefix": ("fleetgate.bench.precise_prefix", "precise prefix routing: cost per decision, event, tokenize"),
    "cost": ("fleetgate.bench.cost", "naive serving vs FleetGate on a mixed multi-tenant workload"),
    "tenancy": ("fleetgate.gateway.tenancy.bench", "exact cost totals, budget race and limiter overhead on Redis"),
    "operator": ("fleetgate.operator.bench", "InferenceService reconcile latency and throughput against kmock"),
    "estimate": ("fleetgate.bench.estimate", "CPU per request of the prompt bound, /tokenize, an in-process tokenizer"),
    "faults": ("fleetgate.bench.faults", "limits back after Redis faults, spend lost to disconnects, budget overrun"),
    "engine": ("fleetgate.local.engine_bench", "the local vLLM CPU engine: start-up, first request, tokens/s, memory"),
}
# `fleetgate bench engine --gpu ...`: the GPU tier's sweep (every engine knob on real vLLM, against the plan).
GPU_ENGINE = ("fleetgate.bench.gpu.sweep", "every engine knob on a real GPU vLLM, against the capacity plan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bench", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own arguments")


def run(args: argparse.Namespace) -> int:
    module_name, help_text = BENCHMARKS[args.bench]
    if args.bench == "engine" and "--gpu" in args.rest:
        module_name, help_text = GPU_ENGINE
        args.rest = [a for a in args.rest if a != "--gpu"]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"fleetgate bench {args.bench}", description=help_text)
    module.add_arguments(sub)
    return int(module.run(sub.parse_args(args.rest)) or 0)
