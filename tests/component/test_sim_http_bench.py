"""`fleetgate bench routing --http` end to end on a small in-process simulated fleet."""

from __future__ import annotations

import argparse

from fleetgate.bench.routing import add_arguments
from fleetgate.sim.http_run import run_http_bench


async def test_http_bench_reads_engine_counters_and_prefix_routing_wins() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--http", "--replicas", "2", "--max-requests", "12", "--rate", "40",
                              "--kv-tokens", "2048", "--prefix-tokens", "512"])
    figures = await run_http_bench(args=args, policies=["round-robin", "default"], config=None)
    rr, default = figures["http-shared-prefix"]
    assert rr["policy"] == "round-robin" and default["policy"] == "default"
    assert sum(rr["spread"]) > 0 and sum(default["spread"]) > 0  # prompt tokens counted by the engines
    assert default["hit_rate"] > rr["hit_rate"]
