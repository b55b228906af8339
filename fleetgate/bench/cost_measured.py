"""The cost benchmark's engine speeds from a measured-throughput file instead of simulator constants.

`fleetgate bench cost --throughput FILE` reads a `fleetgate.bench.measured_throughput` file (the GPU tier's
sweep, or a live routing run's `throughput.json`). For each tier, the entries of its model shape with
quantization `none` and the model dtype's KV cache are candidates (compiled ones before `enforce_eager`
ones); the tier then runs with step-time constants from the card it names:

- **fitted**, from an entry with TTFT points (concurrency 1, one output token, at two or more prompt
  lengths) and decode points (two or more batch sizes of short prompts), as a live run's calibration entry
  holds: prefill seconds per token = the slope of TTFT over prompt length; TPOT(B) = B / tokens/s =
  overhead + slope x B, as `fleetgate.sim.calibrate` fits them;
- **scaled**, from any other entry: its point at the highest concurrency gives one measured figure,
  output tokens/s per replica for (prompt, output, concurrency); the simulated profile's three constants
  are multiplied by one factor so that the profile predicts that figure (a request's replica-seconds at
  a full batch of that concurrency: prompt x prefill + output x (decode + overhead / batch)). The card's
  speed is measured; the split between prefill and decode stays the profile's.

The tier also takes the entry's card, GPUs per replica and the card's hourly price; the simulated engines
then run at the measured speed and the cost model (`fleetgate.bench.cost_fleet`: GPU-seconds of prefill
and decode at full batch) prices the measured work. A tier without a matching entry keeps its simulated
constants. Each tier is labelled `measured (...)` or `simulated (...)` in the table and the report.

On-demand prices per GPU-hour (late 2026, typical cloud list prices; `--usd-per-gpu-hour` overrides):
H200 $5.00, H100 $4.00, A100 $2.50, L40S $1.60, L4 $0.80.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from fleetgate.bench.cost_fleet import TierDeployment
from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile
from fleetgate.sim.profile import SimProfile

GPU_PRICES: tuple[tuple[str, float], ...] = (("h200", 5.00), ("h100", 4.00), ("a100", 2.50), ("l40s", 1.60),
                                             ("l4", 0.80))
SHORT_PROMPT = 256  # decode points: prompts this short leave the step time to decoding


def gpu_price(card: str) -> float | None:
    """The hourly price of the card named (as nvidia-smi names it, any case), None when unknown."""
    name = card.lower().replace(" ", "")
    for key, price in GPU_PRICES:
        if key in name:
            return price
    return None


def candidates(data: ThroughputFile, model_shape: str) -> list[ThroughputEntry]:
    """Unquantized entries of `model_shape` with points, compiled ones first (file order otherwise)."""
    found = [e for e in data.entries if e.model_shape == model_shape and e.quantization == "none"
             and e.kv_cache_dtype in ("auto", "bfloat16", "float16") and e.points and e.speculative is None]
    return sorted(found, key=lambda e: e.enforce_eager)


def fitted_constants(entry: ThroughputEntry) -> tuple[float, float, float] | None:
    """(prefill s/token, step overhead s, decode s per sequence) from TTFT and decode points, or None."""
    ttft = [(p.prompt_tokens, 1.0 / p.output_tokens_per_s) for p in entry.points
            if p.concurrency == 1 and p.output_tokens == 1 and p.output_tokens_per_s > 0]
    decode = [(p.concurrency, p.concurrency / p.output_tokens_per_s) for p in entry.points
              if p.output_tokens > 1 and p.prompt_tokens <= SHORT_PROMPT and p.output_tokens_per_s > 0]
    if len({x for x, _ in ttft}) < 2 or len({x for x, _ in decode}) < 2:
        return None
    prefill, _ = statistics.linear_regression([x for x, _ in ttft], [y for _, y in ttft])
    slope, overhead = statistics.linear_regression([x for x, _ in decode], [y for _, y in decode])
    if prefill <= 0 or slope <= 0:
        return None
    return prefill, max(overhead, 1e-4), slope


def predicted_tps(profile: SimProfile, *, prompt_tokens: int, output_tokens: int, concurrency: int) -> float:
    """Output tokens/s of one replica at a full batch of `concurrency` (the cost model's view of the profile)."""
    batch = max(1, min(concurrency, profile.max_num_seqs))
    per_request = (prompt_tokens * profile.prefill_s_per_token
                   + output_tokens * (profile.decode_s_per_seq + profile.step_overhead_s / batch))
    return output_tokens / per_request if per_request > 0 else 0.0


def measured_profile(entry: ThroughputEntry, base: SimProfile) -> tuple[SimProfile, str]:
    """The tier's profile from `entry`, and how it was obtained (for the label)."""
    fitted = fitted_constants(entry)
    seqs = entry.max_num_seqs or base.max_num_seqs
    if fitted is not None:
        prefill, overhead, slope = fitted
        profile = base.with_(prefill_s_per_token=prefill, step_overhead_s=overhead, decode_s_per_seq=slope,
                             max_num_seqs=seqs)
        how = (f"fitted: prefill {1 / prefill:,.0f} tok/s, TPOT {overhead * 1000:.1f} ms + {slope * 1000:.3f} ms x "
               f"batch")
    else:
        best = max(entry.points, key=lambda p: (p.concurrency, p.output_tokens_per_s))
        profile = base.with_(max_num_seqs=seqs)
        expected = predicted_tps(profile, prompt_tokens=best.prompt_tokens, output_tokens=best.output_tokens,
                                 concurrency=best.concurrency)
        factor = expected / best.output_tokens_per_s
        profile = profile.with_(prefill_s_per_token=profile.prefill_s_per_token * factor,
                                step_overhead_s=profile.step_overhead_s * factor,
                                decode_s_per_seq=profile.decode_s_per_seq * factor)
        how = (f"scaled x{factor:.3f} to {best.output_tokens_per_s:,.0f} output tok/s at {best.concurrency} streams "
               f"of {best.prompt_tokens}+{best.output_tokens} tokens")
    return profile.with_(name=f"measured-{entry.name}"), how


def apply_throughput(
    deployments: tuple[TierDeployment, ...], data: ThroughputFile, *, usd_per_gpu_hour: float | None = None
) -> tuple[tuple[TierDeployment, ...], dict[str, str]]:
    """The deployments with measured constants where `data` has their model shape, and each tier's label."""
    out: list[TierDeployment] = []
    labels: dict[str, str] = {}
    for d in deployments:
        found = candidates(data, d.model)
        if not found:
            out.append(d)
            labels[d.tier] = f"simulated (profile {d.profile.name})"
            continue
        entry = found[0]
        price = usd_per_gpu_hour if usd_per_gpu_hour is not None else gpu_price(entry.card)
        if price is None:
            raise ValueError(f"no price known for the card {entry.card!r}: pass --usd-per-gpu-hour")
        profile, how = measured_profile(entry, d.profile)
        out.append(replace(d, profile=profile, gpu_type=entry.card, gpus_per_replica=entry.gpus,
                           usd_per_gpu_hour=price))
        labels[d.tier] = (f"measured ({entry.name}: {entry.model_shape} {entry.dtype} on {entry.gpus}x {entry.card}, "
                          f"vLLM {data.vllm_version or '?'}; {how}; ${price:.2f}/GPU-hour)")
    return tuple(out), labels
