"""The engine scrape's parse runs on the gateway's event loop (`router.scraping`, every `scrape.intervalS` per
engine): over a vLLM-sized exposition it must cost about what one scan of its lines costs, not a multiple (it built
six prefix strings for every line: ~5 ms of the loop per scrape of 2,000 lines on the 2-core box, ~4x the rest)."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetgate.router.vllm_metrics import parse_vllm_metrics

LABELS = '{engine="0",model_name="llama-3.1-8b"}'


def exposition(families: int = 60, buckets: int = 30) -> str:
    """About what a vLLM server exposes: tens of histogram families of tens of buckets, the wanted gauges among them."""
    lines: list[str] = []
    for f in range(families):
        lines += [f"# HELP vllm:hist_{f} latency", f"# TYPE vllm:hist_{f} histogram"]
        lines += [f'vllm:hist_{f}_bucket{{engine="0",le="{b * 0.5}",model_name="llama-3.1-8b"}} {b * 7.0}'
                  for b in range(buckets)]
        lines += [f"vllm:hist_{f}_sum{LABELS} 1.5", f"vllm:hist_{f}_count{LABELS} 3.0"]
    for name, value in (("vllm:num_requests_running", 64.0), ("vllm:num_requests_waiting", 3.0),
                        ("vllm:kv_cache_usage_perc", 0.25)):
        lines += [f"# HELP {name} x", f"# TYPE {name} gauge", f"{name}{LABELS} {value}"]
    lines += ["# TYPE vllm:cache_config_info gauge",
              'vllm:cache_config_info{block_size="16",num_gpu_blocks="16384",engine="0"} 1.0']
    return "\n".join(lines) + "\n"


def best_of(fn: Callable[[], object], *, repeats: int = 7, calls: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / calls


def test_a_vllm_sized_scrape_parses_at_about_the_cost_of_one_scan_of_its_lines() -> None:
    text = exposition()
    assert len(text.splitlines()) > 1900
    parsed = parse_vllm_metrics(text)
    assert (parsed.running, parsed.waiting, parsed.kv_usage) == (64.0, 3.0, 0.25)
    assert parsed.kv_capacity_tokens == 16384 * 16
    scan_s = best_of(lambda: [ln for ln in text.splitlines() if ln.startswith("vllm:")])
    parse_s = best_of(lambda: parse_vllm_metrics(text))
    # ~2x after, ~7x before (the per-line prefixes); best-of timings of both, back to back, in one process
    assert parse_s < 3.5 * scan_s, (parse_s * 1e3, scan_s * 1e3)
