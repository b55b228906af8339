"""Measure one local vLLM CPU engine serving the prepared Gemma 3 270M (a benchmark, not a test).

Run: `python -m fleetgate.local.engine_bench [--replicas-threads N] [--json]` (PYTHONSAFEPATH=1 from
the repository root). Prints, for this machine:
- model preparation time (cached check; `--fresh-cache DIR` also times a first preparation);
- engine start-up: launch -> `/health` 200 and the model listed;
- memory: RSS and PSS summed over the engine's process group (API server + engine core), and the
  CPU it burns while idle (5 s sample);
- KV cache: the engine's own `vllm:cache_config_info` (block size, number of blocks) and the token
  capacity it logs;
- first-request latency (chat, 16 tokens), time to first token and decode rate of one stream
  (`max_tokens` tokens, `ignore_eos`), aggregate decode rate of `--concurrency` streams;
- prefix caching: the engine's `vllm:prefix_cache_queries/hits` deltas and the time to first token
  for a long prompt sent cold, then again (warm), as the ratio cold/warm.
Decode rate = (tokens - 1) / (time of last token - time of first token).
`--compare w4a16,w8a8` instead compares bf16 with quantized checkpoints (see `quant_bench`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fleetgate.local.config import EngineConfig
from fleetgate.local.engine_probe import (
    MODEL,
    decode_rate,
    delta,
    group_cpu_seconds,
    group_memory_mib,
    metric_values,
    post_json,
    stream_times,
)
from fleetgate.local.engines import EngineFleet
from fleetgate.local.errors import LocalStackError
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.schemes import QUANTIZATIONS
from fleetgate.local.vllm_command import vllm_specs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="prepared weights")
    parser.add_argument("--threads", type=int, help="OpenMP threads for the engine (default: all CPUs)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per decode stream")
    parser.add_argument("--concurrency", type=int, default=4, help="parallel streams for the aggregate rate")
    parser.add_argument("--fresh-cache", type=Path, help="also time a first preparation into this empty dir")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--compare",
        help="comma-separated quantization schemes (w4a16,w8a8) to compare with bf16 in this run "
        "(fleetgate.local.quant_bench)",
    )
    parser.add_argument(
        "--agreement-tokens", type=int, default=16, help="bf16 greedy tokens per prompt, agreement figures (--compare)"
    )


def run(args: argparse.Namespace) -> int:
    """The figures; an engine that fails to start (or stops answering) is reported with its message, exit 1 (the
    engines are already stopped by then: `EngineFleet` stops them on any error)."""
    try:
        return _run(args)
    except (LocalStackError, OSError) as exc:
        print(f"fleetgate bench engine: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.compare:
        from fleetgate.local.quant_bench import run_compare

        schemes = [s.strip() for s in args.compare.split(",") if s.strip()]
        unknown = sorted(set(schemes) - set(QUANTIZATIONS))
        if unknown:
            print(f"fleetgate bench engine: unknown schemes {unknown}; known: {', '.join(QUANTIZATIONS)}")
            return 2
        return run_compare(
            schemes=schemes, max_tokens=args.max_tokens, agreement_tokens=args.agreement_tokens, as_json=args.json
        )
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "dtype": args.dtype, "loadavg_at_start": os.getloadavg()[0]}
    if args.fresh_cache is not None:
        t = time.monotonic()
        prepare_model(cache_dir=args.fresh_cache, dtype=args.dtype)
        figures["prep_first_s"] = time.monotonic() - t
    t = time.monotonic()
    model_path = prepare_model(dtype=args.dtype)
    figures["prep_s"] = time.monotonic() - t
    logs = Path(tempfile.mkdtemp(prefix="fleetgate-engine-bench-"))
    config = EngineConfig(base_port=0, max_model_len=2048, threads=args.threads, dtype=args.dtype, log_dir=logs)
    with EngineFleet(specs=vllm_specs(config=config, model_path=model_path)) as fleet:
        figures["engine_start_s"] = fleet.start()
        url, pgid = fleet.urls[0], fleet.processes[0].pid
        figures["threads"] = config.threads_per_engine()
        figures.update({f"{k}_mib_idle": v for k, v in group_memory_mib(pgid).items()})
        cpu0, t0 = group_cpu_seconds(pgid), time.monotonic()
        time.sleep(5)
        figures["idle_cpu_percent"] = 100 * (group_cpu_seconds(pgid) - cpu0) / (time.monotonic() - t0)
        log = (logs / "engine-0.log").read_text(errors="replace")
        for line in log.splitlines():
            if "KV cache size:" in line:
                figures["kv_log"] = line.split("] ", 1)[-1].strip()
        metrics = metric_values(url)
        figures.update({k: v for k, v in metrics.items() if k.startswith("cache_config.")})
        t = time.monotonic()
        question = [{"role": "user", "content": "What is the capital of France?"}]
        body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": question}
        post_json(f"{url}/v1/chat/completions", body)
        figures["first_request_s"] = time.monotonic() - t
        start, arrivals = stream_times(url, prompt="Once upon a time", max_tokens=args.max_tokens)
        figures["ttft_short_s"] = arrivals[0] - start
        figures["decode_tok_s_1_stream"] = decode_rate(arrivals)
        results: list[list[float]] = []

        def one(i: int) -> None:
            results.append(stream_times(url, prompt=f"Story {i}: once upon a time", max_tokens=args.max_tokens)[1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.concurrency)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        figures[f"decode_tok_s_aggregate_{args.concurrency}_streams"] = sum(len(r) for r in results) / (
            time.monotonic() - t)
        figures.update({f"{k}_mib_after_load": v for k, v in group_memory_mib(pgid).items()})
        prompt = "You are a support assistant for a bakery. Be kind and brief. " * 40 + "When do you open?"
        before = metric_values(url)
        s0, a0 = stream_times(url, prompt=prompt, max_tokens=2)
        mid = metric_values(url)
        s1, a1 = stream_times(url, prompt=prompt, max_tokens=2)
        after = metric_values(url)
        figures["prompt_tokens_long"] = delta(mid, after, "vllm:prompt_tokens_total")
        for tag, x, y in (("cold", before, mid), ("warm", mid, after)):
            figures[f"prefix_queries_{tag}"] = delta(x, y, "vllm:prefix_cache_queries_total")
            figures[f"prefix_hits_{tag}"] = delta(x, y, "vllm:prefix_cache_hits_total")
        figures["ttft_long_cold_s"] = a0[0] - s0
        figures["ttft_long_warm_s"] = a1[0] - s1
        figures["ttft_cold_over_warm"] = figures["ttft_long_cold_s"] / max(1e-9, figures["ttft_long_warm_s"])
    figures["loadavg_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value:.3f}" if isinstance(value, float) else f"{key:40s} {value}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m fleetgate.local.engine_bench", description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
