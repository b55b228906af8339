"""Issue 24's design sweep: the 'vllm-v1' model's fitted H200 constants, changed by hand, on the H200 design runs.

Replays every simulable point of H200 runs 5a-7b (the runs the TTFT work was designed on; never 8a/8b/8d) with the
constants fitted on 5a/5b in docs/reports/data/sim-calibration-gpu-fit.json, each configuration given as JSON
overrides of `SimProfile` fields, and prints the median absolute error of TTFT p50/p90 and output tokens/s, the
hit rate's in points, and the median signed errors of round-robin and of the other profiles apart (the split
that showed the old model's problem: round-robin too slow, the default right for the wrong reason).

    python scripts/sim_design_sweep.py '[{"name": "as fitted"}, {"name": "live text", "chars_per_token": 6.483}]'

Add a second argument (any) to print every point. Virtual time: the figures do not depend on the machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from fleetgate.sim import fit, fit_split

DESIGN = [Path(f"docs/reports/data/gpu-routing-h200-call{c}.jsonl") for c in ("5a", "5b", "5c", "6a", "6b", "7b")]
FITTED = Path("docs/reports/data/sim-calibration-gpu-fit.json")
FIGURES = ("ttft_p50_s", "ttft_p90_s", "output_tps")


async def sweep(configs: list[dict[str, Any]], *, fitted: dict[str, float], runs: list[fit_split.Run],
                verbose: bool) -> None:
    points = fit_split.points_of(runs, profiles=None)
    for config in configs:
        overrides = {k: v for k, v in config.items() if k != "name"}
        errors: dict[str, list[float]] = {m: [] for m in FIGURES}
        signed: dict[str, dict[str, list[float]]] = {g: {m: [] for m in FIGURES} for g in ("rr", "other")}
        hits: list[float] = []
        lines = []
        for (obs, setup), stem in points:
            profile = fit_split.start_profile(runs, setup, card="h200", scheduler="vllm-v1").with_(
                **{**fitted, **overrides})
            sim = await fit.simulate(obs, profile, setup)
            for m in FIGURES:
                e = sim[m] / getattr(obs, m) - 1
                errors[m].append(abs(e))
                signed["rr" if obs.profile == "round-robin" else "other"][m].append(e)
            hits.append(abs(sim["hit_rate"] - obs.hit_rate))
            # hits per prompt token, from the engines' counters (blocked heads' lookups included on both sides)
            per_prompt = (obs.hit_rate * obs.queries_per_prompt_token,
                          sim["hit_rate"] * sim["queries_per_prompt_token"])
            lines.append(f"  {stem.removeprefix('gpu-routing-')} {obs.name} seed {obs.seed}: " + ", ".join(
                f"{m} {getattr(obs, m):.3g} -> {sim[m]:.3g}" for m in (*FIGURES, "hit_rate"))
                + f", hits per prompt token {per_prompt[0]:.2f} -> {per_prompt[1]:.2f}")
        med = statistics.median
        print(f"{config.get('name', overrides)}: |error| TTFT p50 {med(errors['ttft_p50_s']):.0%} p90 "
              f"{med(errors['ttft_p90_s']):.0%} tok/s {med(errors['output_tps']):.0%} hit {100 * med(hits):.1f} pts | "
              + " | ".join(f"{g} signed p50 {med(s['ttft_p50_s']):+.0%} p90 {med(s['ttft_p90_s']):+.0%} "
                           f"tok/s {med(s['output_tps']):+.0%}" for g, s in signed.items()), flush=True)
        if verbose:
            print("\n".join(lines))


if __name__ == "__main__":
    constants = json.loads(FITTED.read_text())["cards"]["h200"]["models"]["vllm-v1"]["fitted"]
    design_runs = [fit_split.load_run(p, max_batched_tokens=8192) for p in DESIGN]
    asyncio.run(sweep(json.loads(sys.argv[1]), fitted=constants, runs=design_runs, verbose=len(sys.argv) > 2))
