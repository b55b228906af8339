"""The cost benchmark's engine speeds from a measured throughput file instead of simulator constants.

`fleetgate bench cost --throughput FILE` reads a `fleetgate.engine.throughput` file (written by a GPU run,
e.g. `scripts/gpu_routing_run.py`'s `throughput.json`). Each tier whose model has a record there gets the
record's step-time constants (prefill seconds per token, decode seconds per sequence, step overhead, batch
size), its GPU and GPUs per replica, and that GPU's hourly price: the simulated engines then run at the
measured speed, and the cost model (`fleetgate.bench.cost_fleet`, GPU-seconds of prefill and decode at
full batch) prices the measured work. A tier without a record keeps its simulated constants. Every tier is
labelled `measured (<record>)` or `simulated (profile <name>)`, and the report prints the labels, so a
reader knows which figures came from a GPU.

On-demand prices per GPU-hour (late 2026, typical cloud list prices; `--usd-per-gpu-hour` overrides):
H100 $4.00, H200 $5.00, A100 $2.50, L40S $1.60, L4 $0.80.
"""

from __future__ import annotations

from dataclasses import replace

from fleetgate.bench.cost_fleet import TierDeployment
from fleetgate.engine.throughput import ThroughputFile

GPU_PRICES: tuple[tuple[str, float], ...] = (("h200", 5.00), ("h100", 4.00), ("a100", 2.50), ("l40s", 1.60),
                                             ("l4", 0.80))


def gpu_price(gpu: str) -> float | None:
    """The hourly price of the card named (as nvidia-smi names it, any case), None when unknown."""
    name = gpu.lower()
    for key, price in GPU_PRICES:
        if key in name:
            return price
    return None


def apply_throughput(
    deployments: tuple[TierDeployment, ...], data: ThroughputFile, *, usd_per_gpu_hour: float | None = None
) -> tuple[tuple[TierDeployment, ...], dict[str, str]]:
    """The deployments with measured constants where `data` has their model, and each tier's label."""
    out: list[TierDeployment] = []
    labels: dict[str, str] = {}
    for d in deployments:
        record = data.find(d.model)
        if record is None:
            out.append(d)
            labels[d.tier] = f"simulated (profile {d.profile.name})"
            continue
        price = usd_per_gpu_hour if usd_per_gpu_hour is not None else gpu_price(record.gpu)
        if price is None:
            raise ValueError(f"no price known for GPU {record.gpu!r}: pass --usd-per-gpu-hour")
        profile = d.profile.with_(prefill_s_per_token=record.prefill_s_per_token,
                                  decode_s_per_seq=record.decode_s_per_seq, step_overhead_s=record.step_overhead_s,
                                  max_num_seqs=record.max_num_seqs, name=f"measured-{record.model}")
        out.append(replace(d, profile=profile, gpu_type=record.gpu, gpus_per_replica=record.gpus_per_replica,
                           usd_per_gpu_hour=price))
        labels[d.tier] = f"measured ({record.describe()}; ${price:.2f}/GPU-hour)"
    return tuple(out), labels
