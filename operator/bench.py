"""`fleetgate bench operator`: reconcile latency and throughput of the real operator against an API server.

Runs the operator (Kopf, handlers, reconciler, lightkube) in-process against kmock (or, with `--server`, an
API server that already has the CRD installed), creates N InferenceServices one after another and measures:
- CR applied -> all children exist (Service, Deployment, PodDisruptionBudget), per CR: p50, p99, max;
- all N reconciled (status.phase written) from the first create, in seconds.
Baseline, measured in the same run against the same server: the bare round trip of one create call
(the floor any reconcile latency sits on). Figures print as ratios to it with the raw numbers beside them.
Targets (BENCHMARKS.md §6): children <= 1 s p99 against a real API server; 100 CRs reconciled in <= 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

CHILD_PLURALS = ("deployments", "services", "poddisruptionbudgets")
SPEC: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"},
    "engine": {"quantization": "awq_marlin", "maxModelLen": 8192, "maxNumSeqs": 32},
    "resources": {"accelerator": "nvidia-l4", "gpus": 1},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=100, help="InferenceServices to create (default 100)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each CR's latency as it is measured")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _bench(count: int, timeout_s: float, verbose: bool = False) -> dict[str, float]:
    import kopf
    from kmock._internal import apps

    from fleetgate.operator.apisim import new_emulator
    from fleetgate.operator.handlers import register
    from fleetgate.operator.kube import KubeApi, resource_class
    from fleetgate.operator.settings import OperatorSettings

    server = new_emulator()
    server.keep_requests(64)  # kmock's per-request cost grows with its request log; a server's does not
    async with server, apps.Server(server):
        url = str(server.url).rstrip("/")
        client = KubeApi.from_server(url=url, field_manager="bench")
        isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")

        def body(name: str) -> Any:
            return isvc.from_dict(
                {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
                 "metadata": {"name": name, "namespace": "bench"}, "spec": SPEC}
            )  # fmt: skip

        # Baseline: bare create round trips with no operator running (then deleted).
        baseline: list[float] = []
        for i in range(20):
            t0 = time.perf_counter()
            await client._client.create(body(f"baseline-{i}"))
            baseline.append(time.perf_counter() - t0)
            await client._client.delete(isvc, f"baseline-{i}", namespace="bench")

        registry = kopf.OperatorRegistry()
        register(
            registry=registry,
            settings=OperatorSettings(),
            make_api=lambda: KubeApi.from_server(url=url, field_manager="fleetgate-operator"),
            login=lambda **_: kopf.ConnectionInfo(server=url, insecure=True),
        )
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready)
        )
        await asyncio.wait_for(ready.wait(), timeout=30)

        def has_children(name: str) -> bool:
            found = {
                r.plural for (r, ns, n), o in server.objects.items() if n == name and ns == "bench" and not o.deleted
            }
            return found >= set(CHILD_PLURALS)

        def reconciled(name: str) -> bool:
            for (r, ns, n), o in server.objects.items():
                if r.plural == "inferenceservices" and ns == "bench" and n == name and not o.deleted:
                    return bool((o.raw.get("status") or {}).get("phase"))
            return False

        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + timeout_s
        for i in range(count):
            name = f"isvc-{i:04d}"
            t0 = time.perf_counter()
            await client._client.create(body(name))
            while not has_children(name):
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{name}: children not created within the time limit")
                await asyncio.sleep(0.01)  # the poll shares the event loop with kmock and the operator
            latencies.append(time.perf_counter() - t0)
            if verbose:
                print(f"  {name}: {latencies[-1] * 1000:.0f} ms", flush=True)
        while not all(reconciled(f"isvc-{i:04d}") for i in range(count)):
            if time.perf_counter() > deadline:
                raise TimeoutError("not every InferenceService reconciled within the time limit")
            await asyncio.sleep(0.01)
        total = time.perf_counter() - start
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)
        await client.aclose()
    return {
        "baseline_p50": statistics.median(baseline),
        "p50": _pct(latencies, 0.5),
        "p99": _pct(latencies, 0.99),
        "max": max(latencies),
        "total": total,
    }


def run(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("kopf").setLevel(logging.CRITICAL)
    fig = asyncio.run(_bench(args.count, args.timeout, args.verbose))
    base = fig["baseline_p50"]
    print(f"operator against kmock, {args.count} InferenceServices created one after another")
    print(f"  baseline: bare create round trip p50       {base * 1000:8.1f} ms   (1.0x)")
    for key in ("p50", "p99", "max"):
        print(f"  CR applied -> 3 children exist, {key:<4}       {fig[key] * 1000:8.1f} ms   ({fig[key] / base:.1f}x)")
    verdict = "meets" if fig["total"] <= 30 else "MISSES"
    print(f"  all {args.count} reconciled (status written)     {fig['total']:8.2f} s    ({verdict} the 30 s target)")
    return 0
