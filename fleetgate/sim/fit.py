"""Fit the simulator's step-time constants to live routing points, tuned on one subset, judged on another.

A live routing run (`fleetgate.bench.live_routing`) leaves, per point, the workload and its seed, the
offered rate, the window and the profile, with the measured TTFT p50/p90, output tokens/s and prefix-cache
hit rate. The simulator can replay exactly those requests (same generator, same seed, token counts in the
simulator's own characters per token) on a virtual fleet of the same size and KV capacity, routed by the
same scheduler (`fleetgate.sim.virtual_fleet`), and predict the same four figures.

`fit(train, base=..., setup=...)` searches multipliers of the three step-time constants
(`step_overhead_s`, `prefill_s_per_token`, `decode_s_per_seq`), starting from `base` (e.g. the constants a
calibration probe measured), coordinate by coordinate over a geometric grid, two passes, minimising the
mean squared log error of TTFT p50, TTFT p90 and output tokens/s over the training points. `evaluate` then
reports each figure's error on any points; the report gives the training set's and the held-out set's
errors side by side, with the starting constants' errors as the baseline ("before the fit").
The default split trains on shared-prefix points of the round-robin profile and holds out every other
profile and workload (the prefix-aware profiles, chat and unique prompts). Profiles the simulator cannot
run (no preset, e.g. a precise-prefix profile fed by engine events) are left out and listed.

`python -m fleetgate.sim.fit RESULTS.jsonl [--train WORKLOAD:PROFILE,...] [--out FILE.md]` runs it on a
results file; `python -m fleetgate.sim.fit --split SPLIT.json [--scheduler reserve,vllm-v1,vllm-v1-livetext]
[--out FILE.md]` on several, per card, tuned on some files and judged on others (`fleetgate.sim.fit_split`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgate.sim.profile import SimProfile
from fleetgate.sim.report import quantile

if TYPE_CHECKING:
    from fleetgate.router.config import RoutingConfig

METRICS = ("ttft_p50_s", "ttft_p90_s", "output_tps")
GRID = (0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0)
CONSTANTS = ("step_overhead_s", "prefill_s_per_token", "decode_s_per_seq")


@dataclass(frozen=True, slots=True)
class Observation:
    workload: str
    profile: str
    load: float
    rate: float
    window_s: float
    seed: int
    users: int
    ttft_p50_s: float
    ttft_p90_s: float
    output_tps: float
    hit_rate: float
    # The engines' own counters over the point, when the row has them (diagnostics, not fitted).
    queries_per_prompt_token: float = math.nan
    preemptions: float = math.nan

    @property
    def key(self) -> str:
        return f"{self.workload}:{self.profile}"

    @property
    def name(self) -> str:
        return f"{self.workload} x{self.load:g} {self.profile}"


@dataclass(frozen=True, slots=True)
class Setup:
    """What the live run's engines and workloads were: the simulator is given the same."""

    replicas: int
    capacity_tokens: int
    max_num_seqs: int
    max_batched_tokens: int
    sizes: dict[str, Any]
    block_size: int = 16
    # Prompt characters per engine token on the live run (its meta row: the engines' tokeniser on the workload's
    # text).
    chars_per_token: float = 4.0
    # The live gateway's scorers' `charsPerToken`: 4 whatever the text was for the runs before it was learned (the
    # meta row says "auto" since), so a replay of an older run routes as that gateway did.
    gateway_chars_per_token: float | str = 4


# A point to simulate: the observation and the set-up of the run it comes from (several runs may be mixed).
Point = tuple[Observation, Setup]


def observations(rows: Sequence[dict[str, Any]], *, repeats: bool = False) -> list[Observation]:
    """The routing points of a results file; `repeats`: also the repeat seeds of a point (tag `seed-N`)."""
    out = []
    for r in rows:
        tag = str(r.get("tag"))
        if r.get("kind") != "point" or r.get("ttft_p50_s") is None:
            continue
        if tag != "routing" and not (repeats and tag.startswith("seed-")):
            continue
        out.append(Observation(workload=r["workload"], profile=r["profile"], load=float(r["load"]),
                               rate=float(r["rate"]), window_s=float(r["window_s"]), seed=int(r["seed"]),
                               users=int(r.get("users") or 0), ttft_p50_s=float(r["ttft_p50_s"]),
                               ttft_p90_s=float(r["ttft_p90_s"]), output_tps=float(r["output_tps"]),
                               hit_rate=float(r["hit_rate"]),
                               queries_per_prompt_token=(float(r["engine_prefix_queries"]) / r["engine_prompt_tokens"]
                                                         if r.get("engine_prompt_tokens") else math.nan),
                               preemptions=float(r.get("engine_preemptions", math.nan))))
    return out


def setup_from(rows: Sequence[dict[str, Any]], *, max_num_seqs: int, max_batched_tokens: int) -> Setup:
    meta = next(r for r in rows if r.get("kind") == "meta")
    return Setup(replicas=int(meta["replicas"]), capacity_tokens=int(meta["kv_capacity_tokens"]),
                 max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens, sizes=dict(meta["sizes"]),
                 chars_per_token=float(meta.get("chars_per_token") or 4.0),
                 gateway_chars_per_token=meta.get("gateway_chars_per_token", 4))


def base_profile(rows: Sequence[dict[str, Any]], setup: Setup, *, fallback: SimProfile) -> SimProfile:
    """The calibration probe's constants (when the run has them), on the run's KV capacity and batch limits."""
    cal = next((r for r in rows if r.get("kind") == "calibration"), None)
    profile = fallback
    if cal is not None:
        profile = profile.with_(step_overhead_s=max(1e-4, float(cal["step_overhead_s"])),
                                prefill_s_per_token=max(1e-8, float(cal["prefill_s_per_token"])),
                                decode_s_per_seq=max(1e-8, float(cal["decode_s_per_seq"])))
    return profile.with_(num_blocks=max(1, setup.capacity_tokens // setup.block_size), block_size=setup.block_size,
                         max_num_seqs=setup.max_num_seqs, max_batched_tokens=setup.max_batched_tokens,
                         chars_per_token=4, time_scale=1.0)


# Plugins the simulated fleet cannot feed: its engines publish no KV-cache events, so a precise scorer there would
# silently be the approximate one, and the fit would compare the simulator's approximate routing to real precise
# routing.
UNSIMULATED_PLUGINS = frozenset({"precise-prefix-scorer"})


def runnable(profile_name: str) -> bool:
    from fleetgate.router.config import preset

    if profile_name == "round-robin":
        return True
    try:
        config = preset(profile_name)
    except ValueError:
        return False
    return not any(p.type in UNSIMULATED_PLUGINS for p in config.plugins)


async def simulate(obs: Observation, profile: SimProfile, setup: Setup) -> dict[str, float]:
    from fleetgate.router.build import build_scheduler
    from fleetgate.router.config import preset
    from fleetgate.router.roundrobin import RoundRobinScheduler
    from fleetgate.router.types import Scheduler
    from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet
    from fleetgate.sim.workloads import Sizes, sized_items

    sizes = Sizes(**setup.sizes)
    items = sized_items(obs.workload, seed=obs.seed, rate=obs.rate, window_s=obs.window_s, sizes=sizes,
                      chars_per_token=profile.chars_per_token, capacity_tokens=setup.capacity_tokens,
                      replicas=setup.replicas, users=obs.users)
    clock = VirtualClock()
    sched: Scheduler = (RoundRobinScheduler() if obs.profile == "round-robin"
                        else build_scheduler(scorers_at(preset(obs.profile), setup.gateway_chars_per_token),
                                             scrape=False, seed=obs.seed, clock=clock))
    result = await run_virtual_fleet(scheduler=sched, items=items, replicas=setup.replicas, profile=profile,
                                     clock=clock, window_s=obs.window_s, send_until_s=obs.window_s)
    return {"ttft_p50_s": quantile(result.ttft_s, 0.5), "ttft_p90_s": quantile(result.ttft_s, 0.9),
            "output_tps": result.window_output_tokens / obs.window_s, "hit_rate": result.hit_rate,
            "queries_per_prompt_token": result.prefix_queries / max(1, result.prompt_tokens),
            "preemptions": float(result.preemptions)}


def scorers_at(config: RoutingConfig, chars_per_token: float | str) -> RoutingConfig:
    """`config` with `charsPerToken` set to `chars_per_token` in its prefix and prefill-queue scorers ("auto": as is,
    the learned default)."""
    if chars_per_token == "auto":
        return config
    config = config.model_copy(deep=True)
    for plugin in config.plugins:
        if plugin.type in ("prefix-affinity-scorer", "prefill-queue-scorer"):
            plugin.parameters["charsPerToken"] = chars_per_token
    return config


def log_error(predicted: float, measured: float) -> float:
    if predicted <= 0 or measured <= 0 or math.isnan(predicted) or math.isnan(measured):
        return 3.0  # a figure the simulator could not produce counts as a large miss (e^3 = 20x)
    return math.log(predicted / measured)


async def loss(points: Sequence[Point], profile: SimProfile) -> float:
    total, n = 0.0, 0
    for obs, setup in points:
        sim = await simulate(obs, profile, setup)
        for m in METRICS:
            total += log_error(sim[m], getattr(obs, m)) ** 2
            n += 1
    return total / max(1, n)


async def fit(train: Sequence[Point], *, base: SimProfile, passes: int = 2, grid: Sequence[float] = GRID,
              constants: Sequence[str] = CONSTANTS, progress: Callable[[str], None] | None = None
              ) -> tuple[SimProfile, float]:
    """The profile (`constants` of `base` times the best multipliers) and its training loss."""
    best = base
    best_loss = await loss(train, best)
    for _ in range(passes):
        for name in constants:
            center = getattr(best, name)
            for mult in grid:
                if mult == 1.0:
                    continue
                candidate = best.with_(**{name: center * mult})
                value = await loss(train, candidate)
                if value < best_loss:
                    best, best_loss = candidate, value
            if progress is not None:
                progress(f"  {name} = {getattr(best, name):.6g} (loss {best_loss:.4f})")
    return best, best_loss


async def evaluate(points: Sequence[Point], profile: SimProfile) -> list[dict[str, Any]]:
    out = []
    for obs, setup in points:
        sim = await simulate(obs, profile, setup)
        row: dict[str, Any] = {"point": obs.name}
        for m in (*METRICS, "hit_rate"):
            measured = getattr(obs, m)
            row[m] = {"measured": measured, "simulated": sim[m],
                      "error": (sim[m] / measured - 1) if measured else None}
        out.append(row)
    return out


def summary(evaluated: list[dict[str, Any]]) -> dict[str, float]:
    """Median absolute relative error per figure (hit rate: absolute difference in points)."""
    out: dict[str, float] = {}
    for m in METRICS:
        errs = [abs(r[m]["error"]) for r in evaluated if r[m]["error"] is not None]
        out[m] = quantile(errs, 0.5) if errs else float("nan")
    diffs = [abs(r["hit_rate"]["simulated"] - r["hit_rate"]["measured"]) for r in evaluated]
    out["hit_rate_points"] = quantile(diffs, 0.5) if diffs else float("nan")
    return out


def split(obs: Sequence[Observation], train_keys: set[str]) -> tuple[list[Observation], list[Observation]]:
    train = [o for o in obs if o.key in train_keys]
    test = [o for o in obs if o.key not in train_keys]
    return train, test


def markdown(result: dict[str, Any]) -> str:
    def pct(v: float) -> str:
        return "-" if v is None or math.isnan(v) else f"{v:.0%}"

    lines = ["# Simulator calibrated against live routing points", "",
             f"Trained on: {', '.join(result['train_keys'])} ({len(result['train'])} points); held out: "
             f"{len(result['test'])} points. Not simulable: {', '.join(result['not_simulable']) or 'none'}.", "",
             "Constants: " + ", ".join(f"{k} {result['base'][k]:.6g} -> {result['fitted'][k]:.6g}" for k in CONSTANTS),
             "", "Median absolute error (hit rate: percentage points):", "",
             "| set | constants | TTFT p50 | TTFT p90 | output tok/s | hit rate |", "|---|---|---:|---:|---:|---:|"]
    for set_name in ("train", "test"):
        for which in ("base", "fitted"):
            s = result["summary"][set_name][which]
            lines.append(f"| {set_name} | {which} | {pct(s['ttft_p50_s'])} | {pct(s['ttft_p90_s'])} | "
                         f"{pct(s['output_tps'])} | {s['hit_rate_points'] * 100:.1f} |")
    lines += ["", "Held-out points (fitted constants), measured -> simulated:", "",
              "| point | TTFT p50 s | TTFT p90 s | output tok/s | hit rate |", "|---|---|---|---|---|"]
    for r in result["points"]["test"]["fitted"]:
        cells = [f"{r[m]['measured']:.3g} -> {r[m]['simulated']:.3g}" for m in (*METRICS, "hit_rate")]
        lines.append(f"| {r['point']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


async def run_fit(rows: Sequence[dict[str, Any]], *, train_keys: set[str], max_num_seqs: int,
                  max_batched_tokens: int, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from fleetgate.sim.profile import PROFILES

    setup = setup_from(rows, max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens)
    base = base_profile(rows, setup, fallback=PROFILES["gpu-8b"])
    every = observations(rows)
    usable = [o for o in every if runnable(o.profile)]
    train, test = split(usable, train_keys)
    if not train:
        raise ValueError(f"no training points for {sorted(train_keys)} among {sorted({o.key for o in usable})}")
    progress(f"fitting on {len(train)} points, holding out {len(test)}")
    fitted, train_loss = await fit([(o, setup) for o in train], base=base, progress=progress)
    result: dict[str, Any] = {"train_keys": sorted(train_keys), "train": [o.name for o in train],
                              "test": [o.name for o in test],
                              "not_simulable": sorted({o.profile for o in every if not runnable(o.profile)}),
                              "base": {k: getattr(base, k) for k in CONSTANTS},
                              "fitted": {k: getattr(fitted, k) for k in CONSTANTS}, "train_loss": train_loss,
                              "summary": {}, "points": {}}
    for set_name, obs in (("train", train), ("test", test)):
        result["summary"][set_name], result["points"][set_name] = {}, {}
        for which, prof in (("base", base), ("fitted", fitted)):
            evaluated = await evaluate([(o, setup) for o in obs], prof)
            result["points"][set_name][which] = evaluated
            result["summary"][set_name][which] = summary(evaluated)
    result["setup"] = asdict(setup)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetgate.sim.fit", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", help="results.jsonl of a live routing run")
    parser.add_argument("--split", type=Path, default=None,
                        help="JSON naming, per card, the results files to tune on and to judge on (instead of RESULTS)")
    parser.add_argument("--scheduler", default="reserve,vllm-v1,vllm-v1-livetext",
                        help="with --split: engine models to fit and compare (fit_split.MODELS), comma-separated")
    parser.add_argument("--profiles", default="", help="with --split: only these routing profiles (comma-separated)")
    parser.add_argument("--passes", type=int, default=2, help="with --split: coordinate-descent passes")
    parser.add_argument("--rescore", type=Path, default=None,
                        help="with --split: re-render this saved FILE.json (its summaries recomputed), no simulation")
    parser.add_argument("--train", default="shared-prefix:round-robin", help="WORKLOAD:PROFILE,... to fit on")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: run-info.json beside the results")
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=None, help="markdown report (and FILE.json beside it)")
    args = parser.parse_args(argv)
    if args.split is not None:
        return _main_split(args)
    if args.results is None:
        parser.error("give RESULTS.jsonl or --split SPLIT.json")
    rows = [json.loads(ln) for ln in args.results.read_text().splitlines() if ln.strip()]
    info_path = args.results.with_name("run-info.json")
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    seqs = args.max_num_seqs or int(info.get("max_num_seqs", 128))
    keys = {k.strip() for k in args.train.split(",") if k.strip()}
    result = asyncio.run(run_fit(rows, train_keys=keys, max_num_seqs=seqs, max_batched_tokens=args.max_batched_tokens))
    text = markdown(result)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


def _main_split(args: argparse.Namespace) -> int:
    from fleetgate.sim import fit_split

    cards = fit_split.load_split(args.split, root=Path.cwd())
    schedulers = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    profiles = {p.strip() for p in args.profiles.split(",") if p.strip()} or None
    if args.rescore is not None:
        result = fit_split.rescore(json.loads(args.rescore.read_text()))
        schedulers = list(result["schedulers"])
    else:
        result = asyncio.run(fit_split.calibrate(cards, schedulers=schedulers, profiles=profiles, passes=args.passes,
                                                 max_batched_tokens=args.max_batched_tokens))
    text = fit_split.markdown(result)
    print(text)
    if args.out is not None:
        tables = "".join(f"\nHeld-out points, {s}, measured -> simulated:\n\n"
                         + fit_split.points_table(result, scheduler=s) for s in schedulers)
        args.out.write_text(text + tables, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
