"""The cost benchmark's engine speeds from a measured-throughput file instead of simulator constants.

`fleetgate bench cost --throughput FILE` reads a `fleetgate.bench.measured_throughput` file (the GPU tier's
sweep, or a live routing run's `throughput.json`); `--throughput` may be given several times, and the
files' entries are pooled (`fleetgate.bench.tier_entry.merge`). By default, for each tier, the entries of
its model shape with quantization `none` and the model dtype's KV cache are candidates (compiled ones
before `enforce_eager` ones, then the files' order). `--tier-entry TIER=SELECTOR` names the tier's entry
instead, whatever its precision or tensor parallelism (`fleetgate.bench.tier_entry`): e.g. the 70B in fp8
on two GPUs for the large tier, whose default (bf16, TP4) a two-GPU machine cannot measure. The tier then
runs with step-time constants from the entry:

- **fitted**, from an entry with TTFT points (concurrency 1, one output token, at two or more prompt
  lengths) and decode points (two or more batch sizes of short prompts), as a live run's calibration entry
  holds: prefill seconds per token = the slope of TTFT over prompt length; TPOT(B) = B / tokens/s =
  overhead + slope x B, as `fleetgate.sim.calibrate` fits them;
- **scaled**, from any other entry: its point at the highest concurrency (of a tie, the longest
  requests) gives one measured figure,
  output tokens/s per replica for (prompt, output, concurrency); the simulated profile's three constants
  are multiplied by one factor so that the profile predicts that figure (a request's replica-seconds at
  a full batch of that concurrency: prompt x prefill + output x (decode + overhead / batch)). The card's
  speed is measured; the split between prefill and decode stays the profile's.

The tier also takes the entry's card, GPUs per replica and the card's hourly price; the simulated engines
then run at the measured speed and the cost model (`fleetgate.bench.cost_fleet`: GPU-seconds of prefill
and decode at full batch) prices the measured work. A tier without a matching entry keeps its simulated
constants. Each tier is labelled `measured (...)` or `simulated (...)` in the table and the report; a
measured label names what was measured (`describe`: shape, weights' precision, KV dtype when not the
model's, TP, eager, GPUs x card), so fp8 on TP2 is never read as the simulated tier's bf16 on TP4, and the
selector when one chose it.

On-demand prices per GPU-hour (late 2026, typical cloud list prices; `--usd-per-gpu-hour` overrides):
H200 $5.00, H100 $4.00, A100 $2.50, L40S $1.60, L4 $0.80.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from fleetgate.bench.cost_fleet import TierDeployment
from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile
from fleetgate.bench.tier_entry import Selector, SourcedEntry, merge, selected
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


def _is_default(entry: ThroughputEntry, model_shape: str) -> bool:
    return (entry.model_shape == model_shape and entry.quantization == "none" and bool(entry.points)
            and entry.kv_cache_dtype in ("auto", "bfloat16", "float16") and entry.speculative is None)  # fmt: skip


def candidates(data: ThroughputFile, model_shape: str) -> list[ThroughputEntry]:
    """Unquantized entries of `model_shape` with points, compiled ones first (file order otherwise)."""
    return sorted((e for e in data.entries if _is_default(e, model_shape)), key=lambda e: e.enforce_eager)


def default_entry(entries: Sequence[SourcedEntry], model_shape: str) -> SourcedEntry | None:
    """The first of `candidates` over merged files (compiled first, then the files' order)."""
    found = sorted((s for s in entries if _is_default(s.entry, model_shape)), key=lambda s: s.entry.enforce_eager)
    return found[0] if found else None


def describe(entry: ThroughputEntry) -> str:
    """What was measured, so that a tier priced on another precision or parallelism says so."""
    weights = entry.dtype if entry.quantization == "none" else f"{entry.quantization} weights"
    kv = "" if entry.kv_cache_dtype in ("auto", entry.dtype) else f", {entry.kv_cache_dtype} KV"
    eager = ", eager (no CUDA graphs)" if entry.enforce_eager else ""
    speculative = f", speculative {entry.speculative}" if entry.speculative else ""
    return (f"{entry.model_shape} {weights}{kv}, TP{entry.tensor_parallel_size}{eager}{speculative}, "
            f"{entry.gpus}x {entry.card}")


def _decode_points(entry: ThroughputEntry) -> list[tuple[int, float]]:
    """(batch, TPOT s) of the decode probe: short prompts, several output tokens."""
    return [(p.concurrency, p.concurrency / p.output_tokens_per_s) for p in entry.points
            if p.output_tokens > 1 and p.prompt_tokens <= SHORT_PROMPT and p.output_tokens_per_s > 0]


def fitted_constants(entry: ThroughputEntry) -> tuple[float, float, float] | None:
    """(prefill s/token, step overhead s, decode s per sequence) from TTFT and decode points, or None."""
    ttft = [(p.prompt_tokens, 1.0 / p.output_tokens_per_s) for p in entry.points
            if p.concurrency == 1 and p.output_tokens == 1 and p.output_tokens_per_s > 0]
    decode = _decode_points(entry)
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
        # Full batches no larger than the largest batch measured: the step overhead shared by 1,024 sequences
        # (a 70B entry's engine limit) would be an extrapolation 16x past the 64 streams the probe ran.
        measured_batch = max(b for b, _ in _decode_points(entry))
        capped = min(seqs, measured_batch)
        profile = base.with_(prefill_s_per_token=prefill, step_overhead_s=overhead, decode_s_per_seq=slope,
                             max_num_seqs=capped)
        how = (f"fitted: prefill {1 / prefill:,.0f} tok/s, TPOT {overhead * 1000:.1f} ms + {slope * 1000:.3f} ms x "
               f"batch" + (f", batches of at most {capped} (the largest measured; the engine allows {seqs})"
                           if capped < seqs else ""))
    else:
        # the highest concurrency; of a tie, the longest requests (a sweep level rather than a decode probe's
        # short ones, whose tokens/s leaves out the prefill)
        best = max(entry.points,
                   key=lambda p: (p.concurrency, p.prompt_tokens + p.output_tokens, p.output_tokens_per_s))
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
    deployments: tuple[TierDeployment, ...],
    data: ThroughputFile | Sequence[SourcedEntry],
    *,
    tier_entries: Mapping[str, Selector] | None = None,
    usd_per_gpu_hour: float | None = None,
) -> tuple[tuple[TierDeployment, ...], dict[str, str]]:
    """The deployments with measured constants where an entry prices them, and each tier's label.

    `data` is one file or the entries of several (`tier_entry.merge`); `tier_entries` picks a tier's entry
    explicitly (`--tier-entry`), otherwise a tier takes its default entry (`default_entry`) if any.
    Raises `tier_entry.SelectorError` (a ValueError) for a selector matching no entry or several.
    """
    entries = merge([("the throughput file", data)]) if isinstance(data, ThroughputFile) else tuple(data)
    chosen = selected(tier_entries or {}, entries, models={d.tier: d.model for d in deployments})
    out: list[TierDeployment] = []
    labels: dict[str, str] = {}
    for d in deployments:
        sourced = chosen.get(d.tier) or default_entry(entries, d.model)
        if sourced is None:
            out.append(d)
            labels[d.tier] = f"simulated (profile {d.profile.name})"
            continue
        entry = sourced.entry
        price = usd_per_gpu_hour if usd_per_gpu_hour is not None else gpu_price(entry.card)
        if price is None:
            raise ValueError(f"no price known for the card {entry.card!r}: pass --usd-per-gpu-hour")
        profile, how = measured_profile(entry, d.profile)
        out.append(replace(d, profile=profile, gpu_type=entry.card, gpus_per_replica=entry.gpus,
                           usd_per_gpu_hour=price))
        selector = (tier_entries or {}).get(d.tier)
        picked = f"; chosen by --tier-entry {d.tier}={selector.text}" if selector is not None else ""
        labels[d.tier] = (f"measured ({entry.name}: {describe(entry)}, vLLM {sourced.vllm_version or '?'}{picked}; "
                          f"{how}; ${price:.2f}/GPU-hour)")
    return tuple(out), labels
