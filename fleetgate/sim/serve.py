"""`fleetgate sim`: run N simulated vLLM engines until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from fleetgate.sim.profile import PROFILES, get_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="number of simulated engines (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--base-port", type=int, default=8100, help="replica i listens on base-port + i; 0 = free")
    parser.add_argument("--profile", default="vllm-cpu-gemma3-270m", choices=sorted(PROFILES))
    parser.add_argument("--model", default=None, help="served model name (default: the profile's)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per engine second")
    parser.add_argument("--kv-blocks", type=int, default=None, help="KV capacity in blocks (default: profile)")
    lora = parser.add_argument_group("LoRA (vLLM's flags; the runtime load/unload API is served when the "
                                     "environment has VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
    lora.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters on the base model")
    lora.add_argument("--max-loras", type=int, default=1, help="adapters one batch can hold (GPU slots; default 1)")
    lora.add_argument("--max-lora-rank", type=int, default=16, help="largest adapter rank accepted (default 16)")
    lora.add_argument("--max-cpu-loras", type=int, default=None, help="adapters cached in host memory "
                      "(default: --max-loras)")
    lora.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                      help="adapters registered at start-up: name=path or JSON {\"name\": ..., \"path\": ...}")
    parser.add_argument("--calibrate", metavar="URL", default=None,
                        help="instead of serving: probe the engine at URL (e.g. vLLM), fit the step-time "
                        "constants and compare the simulator under them")


def lora_changes(args: argparse.Namespace) -> dict[str, object]:
    """Profile fields from the LoRA flags (vLLM's validation: positive slots, CPU cache >= slots)."""
    from fleetgate.sim.lora import parse_lora_module

    if args.max_loras < 1 or args.max_lora_rank < 1:
        raise SystemExit("--max-loras and --max-lora-rank must be >= 1")
    if args.max_cpu_loras is not None and args.max_cpu_loras < args.max_loras:
        raise SystemExit("--max-cpu-loras must be >= --max-loras")
    try:
        modules = tuple(parse_lora_module(m) for m in args.lora_modules)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    runtime = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower() in ("1", "true")
    return {"enable_lora": True, "max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank,
            "max_cpu_loras": args.max_cpu_loras, "lora_modules": modules, "allow_runtime_lora_updating": runtime}


async def _serve(args: argparse.Namespace) -> None:
    from fleetgate.sim.fleet import start_sim_fleet

    profile = get_profile(args.profile)
    changes: dict[str, object] = {"time_scale": args.time_scale}
    if args.model:
        changes["model"] = args.model
    if args.kv_blocks:
        changes["num_blocks"] = args.kv_blocks
    if args.enable_lora:
        changes.update(lora_changes(args))
    elif args.lora_modules:
        raise SystemExit("--lora-modules needs --enable-lora")
    profile = profile.with_(**changes)
    fleet = await start_sim_fleet(replicas=args.replicas, host=args.host, base_port=args.base_port, profile=profile)
    try:
        for url in fleet.urls:
            print(f"sim engine serving {profile.model!r} at {url}/v1 (metrics {url}/metrics)", flush=True)
        await asyncio.Event().wait()
    finally:
        await fleet.aclose()


async def _calibrate(args: argparse.Namespace) -> None:
    import aiohttp

    from fleetgate.sim.calibrate import fit_line, probe, report
    from fleetgate.sim.fleet import start_sim_fleet

    url = args.calibrate.rstrip("/").removesuffix("/v1")
    model = args.model
    if model is None:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
    print(f"probing {model!r} at {url} (TTFT vs prompt length, TPOT vs batch) ...", flush=True)
    real = await probe(url=url, model=model)
    a, b = fit_line(real.ttft_by_len)
    c, d = fit_line(real.tpot_by_batch)
    base = get_profile(args.profile)
    fitted = base.with_(prefill_s_per_token=max(b, 1e-7), decode_s_per_seq=max(d, 1e-7),
                        step_overhead_s=max(c, 1e-4), model=model, time_scale=1.0,
                        chars_per_token=max(1, round(real.chars_per_token)))
    print(f"engine tokeniser: {real.chars_per_token:.2f} characters per token on these prompts")
    print(f"fit: TTFT = {a:.4f} + {b * 1000:.4f} ms x prompt tokens; TPOT = {c:.4f} + {d * 1000:.4f} ms x batch")
    fleet = await start_sim_fleet(replicas=1, profile=fitted)
    try:
        sim = await probe(url=fleet.urls[0], model=model)
    finally:
        await fleet.aclose()
    print(report(real, sim))
    print(f"profile: step_overhead_s={fitted.step_overhead_s:.5f}, prefill_s_per_token={fitted.prefill_s_per_token:.7f}"
          f", decode_s_per_seq={fitted.decode_s_per_seq:.6f}")


def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_calibrate(args) if args.calibrate else _serve(args))
    return 0
