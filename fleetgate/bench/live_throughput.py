"""A live routing run's measured throughput, in the GPU tier's file (`fleetgate.bench.measured_throughput`).

One entry per kind of measurement, all of one engine configuration (shape, dtype, card, batch limits):

- `<shape>-calibration`: the calibration probe on one engine, prompts that share nothing. TTFT points
  (concurrency 1, `output_tokens` 1, so `output_tokens_per_s` = 1 / TTFT) at each prompt length, and
  decode points (concurrency B, 64-token prompts, 32 output tokens, `output_tokens_per_s` = B / TPOT(B)).
  `fleetgate bench cost --throughput` fits the simulator's step-time constants from these exactly as
  `fleetgate.sim.calibrate` does (prefill seconds per token; TPOT = overhead + slope x batch).
- `<shape>-capacity-round-robin`: the capacity probe (closed loop, round-robin, shared-prefix prompts,
  about half their tokens found in the prefix cache), per replica.
- `<shape>-<workload>-<profile>`: every routing point of that workload and profile, one point per
  offered load: `concurrency` is the mean number of requests in flight per replica (Little's law over
  the point), `prompt_tokens` the engines' counted prompt tokens per request, `output_tokens_per_s` the
  engines' generated tokens per second per replica over the window, TTFT at the client.
Per replica, so per GPU when `gpus` is 1.
"""

from __future__ import annotations

import time
from typing import Any

from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile, ThroughputPoint


def calibration_points(cal: dict[str, Any], *, reps: int) -> list[ThroughputPoint]:
    """TTFT points from `ttft_by_len` (prompt tokens -> seconds) and decode points from `tpot_by_batch`."""
    out = []
    for length, ttft in sorted((int(k), float(v)) for k, v in cal["ttft_by_len"].items()):
        if ttft > 0:
            out.append(ThroughputPoint(concurrency=1, requests=reps, prompt_tokens=length, output_tokens=1,
                                       output_tokens_per_s=1.0 / ttft, ttft_p50_s=ttft, ttft_p90_s=None))
    for batch, tpot in sorted((int(k), float(v)) for k, v in cal["tpot_by_batch"].items()):
        if tpot > 0:
            out.append(ThroughputPoint(concurrency=batch, requests=batch * reps, prompt_tokens=64, output_tokens=32,
                                       output_tokens_per_s=batch / tpot, ttft_p50_s=None, ttft_p90_s=None))
    return out


def throughput_file(rows: list[dict[str, Any]], info: dict[str, Any]) -> ThroughputFile | None:
    """The file of a run (None when it measured nothing it could hold)."""
    meta = next((r for r in rows if r.get("kind") == "meta"), {})
    replicas = max(1, int(meta.get("replicas", 1)))
    sizes = meta.get("sizes", {})
    shape = str(info.get("model_shape", meta.get("model", "?")))
    common: dict[str, Any] = {
        "model_shape": shape, "parameters": int(info.get("parameters", 0)),
        "dtype": str(info.get("dtype", "bfloat16")), "quantization": str(info.get("quantization", "none")),
        "kv_cache_dtype": str(info.get("kv_cache_dtype", "auto")), "card": str(info.get("card", "unknown")),
        "gpus": 1, "tensor_parallel_size": 1, "enforce_eager": bool(info.get("enforce_eager", False)),
        "speculative": None, "max_num_seqs": int(info.get("max_num_seqs", 0)),
        "max_num_batched_tokens": int(info.get("max_num_batched_tokens", 0)),
    }
    entries: list[ThroughputEntry] = []
    cal = next((r for r in rows if r.get("kind") == "calibration"), None)
    if cal is not None:
        reps = int(meta.get("options", {}).get("calibration_reps", 3))
        points = calibration_points(cal, reps=reps)
        if points:
            entries.append(ThroughputEntry(name=f"{shape}-calibration", points=tuple(points), **common))
    cap = next((r for r in rows if r.get("kind") == "capacity"), None)
    if cap is not None and cap.get("output_tps"):
        point = ThroughputPoint(
            concurrency=max(1, round(cap["concurrency"] / replicas)), requests=int(cap["completed"]),
            prompt_tokens=int(sizes.get("prefix_tokens", 0)) + int(sizes.get("question_tokens", 0)),
            output_tokens=int(sizes.get("output_tokens", 0)), output_tokens_per_s=cap["output_tps"] / replicas,
            ttft_p50_s=cap.get("ttft_p50_s"), ttft_p90_s=cap.get("ttft_p90_s"))
        entries.append(ThroughputEntry(name=f"{shape}-capacity-round-robin", points=(point,), **common))
    groups: dict[str, list[ThroughputPoint]] = {}
    for r in rows:
        if r.get("kind") != "point" or r.get("tag") != "routing" or not r.get("requests"):
            continue
        groups.setdefault(f"{shape}-{r['workload']}-{r['profile']}", []).append(ThroughputPoint(
            concurrency=max(1, round(float(r.get("mean_in_flight") or 0) / replicas)), requests=int(r["requests"]),
            prompt_tokens=round(float(r["engine_prompt_tokens"]) / max(1, int(r["requests"]))),
            output_tokens=int(sizes.get("output_tokens", 0)), output_tokens_per_s=float(r["output_tps"]) / replicas,
            ttft_p50_s=r.get("ttft_p50_s"), ttft_p90_s=r.get("ttft_p90_s")))
    for name, points in groups.items():
        entries.append(ThroughputEntry(name=name, points=tuple(sorted(points, key=lambda p: p.concurrency)), **common))
    if not entries:
        return None
    return ThroughputFile(measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          command=str(info.get("source", "fleetgate bench routing --live")),
                          vllm_version=str(info.get("vllm_version", "")), entries=tuple(entries))
