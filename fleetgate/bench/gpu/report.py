"""What a sweep leaves behind for people and for the cost report: summary.md and throughput.json.

`summary_markdown` is one table row per configuration: status, start-up time, and for each figure the
plan, vLLM and the error (weights, KV-cache tokens, maximum concurrency), then output tokens/s and TTFT
p50 per load level. `throughput_file` turns the served configurations' load levels into the
`fleetgate.bench.measured_throughput` schema; a configuration that ran the calibration probe also gets its
TTFT points (one stream, one output token: tokens/s = 1 / TTFT p50) and decode points (B streams of
64-token prompts, 32 output tokens: tokens/s = B / TPOT p50), the points the live routing run's
calibration entry holds, so the cost report fits step-time constants from them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetgate.bench.gpu.load import CALIBRATION_REPS
from fleetgate.bench.gpu.matrix import SweepConfig
from fleetgate.bench.gpu.models import model_config
from fleetgate.bench.live_throughput import calibration_points as calibration_points_of
from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile, ThroughputPoint
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import batch_limits
from fleetgate.operator.spec import parse_spec


def _dtype(config: SweepConfig) -> str:
    dtype = str(config.spec.get("engine", {}).get("dtype", "auto"))
    if dtype == "auto" and config.shape is not None:
        return str(model_config(config.shape).get("torch_dtype", "auto"))
    return dtype


def _speculative(engine: dict[str, Any]) -> str | None:
    spec = engine.get("speculative")
    return f"{spec['method']}/{spec.get('numTokens', 4)}" if spec else None


def calibration_points(levels: list[dict[str, Any]]) -> tuple[ThroughputPoint, ...]:
    """The calibration probe's levels (`load.calibration`) as the calibration entry's points; a level with
    a failed request is left out."""
    ttft = {lv["prompt_tokens"]: lv["ttft_p50_s"] for lv in levels
            if lv["probe"] == "ttft" and lv["ok"] == lv["requests"] > 0 and lv["ttft_p50_s"]}
    tpot = {lv["concurrency"]: lv["tpot_p50_s"] for lv in levels
            if lv["probe"] == "decode" and lv["ok"] == lv["requests"] > 0 and lv.get("tpot_p50_s")}
    return tuple(calibration_points_of({"ttft_by_len": ttft, "tpot_by_batch": tpot}, reps=CALIBRATION_REPS))


def throughput_file(
    *, configs: list[SweepConfig], results: dict[str, dict[str, Any]], card: str, vllm_version: str, command: str,
    profiles: Profiles,
) -> ThroughputFile:  # fmt: skip
    entries = []
    for config in configs:
        result = results.get(config.name) or {}
        levels = result.get("bench") or []
        if result.get("status") != "served" or not levels:
            continue
        spec = parse_spec(dict(config.spec))
        limits = batch_limits(spec=spec, profile=profiles.resolve(name=spec.resources.accelerator))
        engine = dict(config.spec.get("engine", {}))
        arch = config.spec.get("model", {}).get("architecture") or {}
        points = tuple(
            ThroughputPoint(concurrency=lv["concurrency"], requests=lv["requests"], prompt_tokens=lv["prompt_tokens"],
                            output_tokens=lv["output_tokens"] // max(1, lv["requests"]),
                            output_tokens_per_s=lv["output_tokens_per_s"], ttft_p50_s=lv["ttft_p50_s"],
                            ttft_p90_s=lv["ttft_p90_s"])
            for lv in levels if lv.get("ok")
        ) + calibration_points(result.get("calibration") or [])  # fmt: skip
        entries.append(ThroughputEntry(
            name=config.name, model_shape=config.shape or config.name,
            parameters=round(float(arch.get("parametersBillions", 0)) * 1e9), dtype=_dtype(config),
            quantization=str(engine.get("quantization", "none")),
            kv_cache_dtype=str(engine.get("kvCacheDtype", "auto")),
            card=card, gpus=config.gpus, tensor_parallel_size=int(engine.get("tensorParallelSize", 1)),
            enforce_eager=bool(engine.get("enforceEager", False)), speculative=_speculative(engine),
            max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens, points=points,
        ))  # fmt: skip
    return ThroughputFile(measured_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), command=command,
                          vllm_version=vllm_version, entries=tuple(entries))  # fmt: skip


def _figure(result: dict[str, Any], name: str, fmt: str) -> str:
    fig = (result.get("comparison") or {}).get(name)
    if not fig:
        return ""
    error = f" ({fig['error_pct']:+.1f}%)" if fig.get("error_pct") is not None else ""
    return f"{fig['plan']:{fmt}} / {fig['vllm']:{fmt}}{error}"


def summary_markdown(*, header: dict[str, Any], configs: list[SweepConfig], results: dict[str, dict[str, Any]]) -> str:
    cards = ", ".join(f"{c['name']}" for c in header.get("cards", [])) or "cpu"
    lines = [
        f"# GPU tier sweep ({header.get('started_at')})",
        "",
        f"Device: {header.get('device')} ({cards}); profile {header.get('profile')}; "
        f"vLLM {header.get('vllm_version')}; tokenizer {header.get('tokenizer')}; "
        f"deadline {header.get('deadline_s')} s.",
        "",
        "| configuration | status | ready s | weights GiB plan / vLLM | KV tokens plan / vLLM | max concurrency "
        "plan / vLLM | tok/s by streams | TTFT p50 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        r = results.get(config.name, {})
        status = r.get("status", "?")
        why = r.get("failure") or r.get("invalid_message") or r.get("reason") or ""
        if status == "refused_by_vllm":
            why = (r.get("preflight") or {}).get("error", "")
        ready = (r.get("milestones") or {}).get("ready", "")
        bench = r.get("bench") or []
        tps = ", ".join(f"{lv['concurrency']}: {lv['output_tokens_per_s']:.0f}" for lv in bench)
        ttft = ", ".join(f"{lv['concurrency']}: {lv['ttft_p50_s']:.3f}" for lv in bench if lv.get("ttft_p50_s"))
        status_text = f"{status}" + (f": {why[:160]}" if why and status != "served" else "")
        if r.get("call"):  # merged from an earlier call (`--merge`), compared with the current plan
            status_text += f" (call {r['call']})"
        lines.append(
            f"| {config.name} | {status_text} | {ready} | {_figure(r, 'weights', '.2f')} | "
            f"{_figure(r, 'kv_tokens', ',.0f')} | {_figure(r, 'max_concurrency', '.2f')} | {tps} | {ttft} |"
        )
    return "\n".join(lines) + "\n"
