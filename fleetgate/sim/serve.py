"""`fleetgate sim`: run N simulated vLLM engines until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from fleetgate.sim.profile import PROFILES, get_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="number of simulated engines (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--base-port", type=int, default=8100, help="replica i listens on base-port + i; 0 = free")
    parser.add_argument("--profile", default="vllm-cpu-gemma3-270m", choices=sorted(PROFILES))
    parser.add_argument("--model", default=None, help="served model name (default: the profile's)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per engine second")
    parser.add_argument("--kv-blocks", type=int, default=None, help="KV capacity in blocks (default: profile)")


async def _serve(args: argparse.Namespace) -> None:
    from fleetgate.sim.fleet import start_sim_fleet

    profile = get_profile(args.profile)
    changes: dict[str, object] = {"time_scale": args.time_scale}
    if args.model:
        changes["model"] = args.model
    if args.kv_blocks:
        changes["num_blocks"] = args.kv_blocks
    profile = profile.with_(**changes)
    fleet = await start_sim_fleet(replicas=args.replicas, host=args.host, base_port=args.base_port, profile=profile)
    try:
        for url in fleet.urls:
            print(f"sim engine serving {profile.model!r} at {url}/v1 (metrics {url}/metrics)", flush=True)
        await asyncio.Event().wait()
    finally:
        await fleet.aclose()


def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0
