"""The default profile at `charsPerToken: auto` against `charsPerToken: 4` on the frozen vllm-v1-livetext simulator.

Set-up: run 5a's (2 H200 engines of Llama 3.1 8B, 65,536 KV tokens each, its workload sizes, prompts at its measured
6.48 characters per token; docs/reports/data/gpu-routing-h200-call5a.jsonl) with the frozen constants of
`scripts/sim_gateway_chars_per_token.py` (fitted on 5a/5b). Offered load is relative to run 5a's round-robin
capacity (61.35 requests/s at 1.0). Each point runs the default profile twice on the same seeded arrivals: scorers
at `auto` (the scheduler learns the ratio from the simulated engines' usage, as the gateway does) and at a fixed 4
(the GPU runs' gateway); shared prefixes at 1.0, 1.2, 1.35, 1.5 beside round-robin, unique prompts at 0.8 and 1.0
beside least-loaded. `--text-cpt 4` runs the same at 4 characters per token (auto should learn ~4 and change
nothing). SEEDS were chosen for this comparison and committed before it was first run; none is a design-run seed.
A simulator prediction, not a measurement: the GPU A/B is `default` beside `default-cpt4`
(scripts/gpu/profiles/default-cpt4.yaml).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/sim_chars_per_token_ab.py [--text-cpt 6.48] [--seeds 71001,71002,71003]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
from pathlib import Path

from fleetgate.sim import fit, fit_split

RUN = Path("docs/reports/data/gpu-routing-h200-call5a.jsonl")
FROZEN = {"step_overhead_s": 0.003339, "prefill_s_per_token": 2.4543e-05, "decode_s_per_seq": 1.20027e-05,
          "decode_s_per_ctx_token": 2.73067e-08, "request_overhead_s": 0.028}  # as sim_gateway_chars_per_token.py
CAPACITY_RPS = 61.35  # run 5a's round-robin capacity (its 1.0x rate)
SEEDS = (71001, 71002, 71003)
POINTS = [("shared-prefix", 1.0, "round-robin"), ("shared-prefix", 1.2, "round-robin"),
          ("shared-prefix", 1.35, "round-robin"), ("shared-prefix", 1.5, "round-robin"),
          ("unique", 0.8, "least-loaded"), ("unique", 1.0, "least-loaded")]
WINDOW_S = {"shared-prefix": 10.0, "unique": 12.0}  # as the design runs
FIGURES = ("ttft_p50_s", "ttft_p90_s", "output_tps", "hit_rate")


def observation(workload: str, profile: str, load: float, seed: int) -> fit.Observation:
    nan = float("nan")
    return fit.Observation(workload=workload, profile=profile, load=load, rate=CAPACITY_RPS * load,
                           window_s=WINDOW_S[workload], seed=seed, users=0, ttft_p50_s=nan, ttft_p90_s=nan,
                           output_tps=nan, hit_rate=nan)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text-cpt", type=float, default=None, help="characters per token of the text (default: 5a's)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--json", type=Path, default=None, help="write every simulated point here")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    run = fit_split.load_run(RUN, max_batched_tokens=8192)
    setup = run.setup
    if args.text_cpt is not None:
        setup = dataclasses.replace(setup, chars_per_token=args.text_cpt)
    profile = fit_split.start_profile([run], setup, card="h200", scheduler="vllm-v1-livetext").with_(**FROZEN)
    print(f"text at {setup.chars_per_token:.2f} chars/token, {setup.replicas} engines x {setup.capacity_tokens} KV "
          f"tokens, seeds {seeds}")
    rows = []
    for workload, load, base in POINTS:
        per: dict[str, list[dict[str, float]]] = {"auto": [], "4": [], base: []}
        for seed in seeds:
            for variant in per:
                name = base if variant == base else "default"
                cpt = {"auto": "auto", "4": 4}.get(variant, 4)
                sim = await fit.simulate(observation(workload, name, load, seed), profile,
                                         dataclasses.replace(setup, gateway_chars_per_token=cpt))
                per[variant].append(sim)
                rows.append({"workload": workload, "load": load, "seed": seed, "variant": variant, **sim})
        med = {v: {f: statistics.median(s[f] for s in sims) for f in FIGURES} for v, sims in per.items()}
        line = f"{workload:13s} x{load:<4g}"
        for v in ("auto", "4", base):
            m = med[v]
            line += (f" | {v}: p50 {m['ttft_p50_s']:.3f} p90 {m['ttft_p90_s']:.3f} out {m['output_tps']:.0f}"
                     f" hit {m['hit_rate']:.3f}")
        print(line)
        ratios = []
        for f in FIGURES[:3]:
            per_seed = [a[f] / b[f] for a, b in zip(per["auto"], per["4"], strict=True) if b[f] > 0]
            vs_base = [a[f] / b[f] for a, b in zip(per["auto"], per[base], strict=True) if b[f] > 0]
            four_base = [a[f] / b[f] for a, b in zip(per["4"], per[base], strict=True) if b[f] > 0]
            ratios.append(f"{f} auto/4 {statistics.median(per_seed):.3f} (auto/{base} "
                          f"{statistics.median(vs_base):.3f}, 4/{base} {statistics.median(four_base):.3f})")
        hit = statistics.median(a["hit_rate"] - b["hit_rate"] for a, b in zip(per["auto"], per["4"], strict=True))
        print("    " + "; ".join(ratios) + f"; hit auto-4 {hit:+.3f}")
    if args.json is not None:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    asyncio.run(main())
