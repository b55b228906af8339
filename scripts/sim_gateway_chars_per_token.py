"""What the frozen 'vllm-v1-livetext' simulator predicts if the gateway's scorers knew Llama 3.1's characters per token.

The live H200 runs' gateway used the presets' `charsPerToken` 4 (prefix scorer: an engine's index size; prefill-queue
scorer: a prompt's tokens) on text of 6.48 characters per token (docs/reports/sim-calibration-gpu.md, "Why TTFT was
off past saturation"). This replays the default profile's shared-prefix points of the design runs (5a-7b) with the
frozen H200 constants three times: scorers as run, with `charsPerToken` 6 (the prefix scorer takes an integer) and
6.48 (the replay's `Setup.gateway_chars_per_token`, which `fleetgate.sim.fit.simulate` sets in both scorers; the
prefix scorer truncates 6.48 to 6), and a third time at `auto` (learned from the simulated engines' usage, the
default since). A simulator prediction for a GPU A/B to check, not a measurement.

    python scripts/sim_gateway_chars_per_token.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from pathlib import Path

from fleetgate.sim import fit, fit_split

DESIGN = [Path(f"docs/reports/data/gpu-routing-h200-call{c}.jsonl") for c in ("5a", "5b", "5c", "6a", "6b", "7b")]
# fitted on 5a/5b (docs/reports/data/sim-calibration-gpu-fit-9-vllm-v1-livetext.txt)
FROZEN = {"step_overhead_s": 0.003339, "prefill_s_per_token": 2.4543e-05, "decode_s_per_seq": 1.20027e-05,
          "decode_s_per_ctx_token": 2.73067e-08, "request_overhead_s": 0.028}
REAL_CHARS_PER_TOKEN = 6.48


async def replay(runs: list[fit_split.Run], points: list[tuple[fit.Point, str]],
                 gateway_chars_per_token: float | str | None = None) -> list[dict[str, float]]:
    out = []
    for (obs, setup), _ in points:
        profile = fit_split.start_profile(runs, setup, card="h200", scheduler="vllm-v1-livetext").with_(**FROZEN)
        if gateway_chars_per_token is not None:
            setup = dataclasses.replace(setup, gateway_chars_per_token=gateway_chars_per_token)
        out.append(await fit.simulate(obs, profile, setup))
    return out


def main() -> None:
    runs = [fit_split.load_run(p, max_batched_tokens=8192) for p in DESIGN]
    points = [pt for pt in fit_split.points_of(runs, profiles={"default"}) if pt[0][0].workload == "shared-prefix"]
    med = statistics.median
    measured = [obs for (obs, _), _ in points]
    print(f"{len(points)} default shared-prefix points; measured (charsPerToken 4): median TTFT p50 "
          f"{med(o.ttft_p50_s for o in measured):.2f} s, p90 {med(o.ttft_p90_s for o in measured):.2f} s, "
          f"hit rate {med(o.hit_rate for o in measured):.3f}")
    as_run = asyncio.run(replay(runs, points))
    knowing = asyncio.run(replay(runs, points, REAL_CHARS_PER_TOKEN))
    learning = asyncio.run(replay(runs, points, "auto"))
    for label, sims in (("simulated, charsPerToken 4 (as run)", as_run),
                        ("simulated, charsPerToken 6 / 6.48", knowing), ("simulated, charsPerToken auto", learning)):
        print(f"{label}: median TTFT p50 {med(s['ttft_p50_s'] for s in sims):.2f} s, p90 "
              f"{med(s['ttft_p90_s'] for s in sims):.2f} s, hit rate {med(s['hit_rate'] for s in sims):.3f}, "
              f"output {med(s['output_tps'] for s in sims):.0f} tok/s")


if __name__ == "__main__":
    main()
