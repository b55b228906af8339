"""Calibrate the simulator on several live routing runs, per card, tuned on some files and judged on others.

A split file (JSON, written before any error is looked at) names, per card, the results files that tune
that card's step-time constants (`train`) and those that judge them (`test`):

    {"cards": {"h100": {"train": ["...call1.jsonl"], "test": ["...call3a.jsonl", ...]}, ...}}

(a card may also name `probe` files, read only for their calibration probe, the constants' start).

Each file's set-up (replicas, KV capacity, sizes) comes from its own meta row and its `max_num_seqs` from
the run-info beside it (`<stem>-run-info.json` or `run-info.json`). Points: every routing point and its
repeat seeds (`fit.observations(repeats=True)`) of a profile the simulator runs (`fit.runnable`), or only
the `--profiles` named. For each engine model asked (`MODELS`: "reserve", the simulator before this
calibration, with its three step constants; "vllm-v1", with two more: the decode attention per context token and
the per-request overhead; "vllm-v1-livetext", "vllm-v1" on prompts at the live run's characters per token, see
`Model`), each card's constants are fitted on its training points from
the same start (the first calibration probe found in the files, the attention term from the card's memory
bandwidth) and every point is replayed with them. The report gives, per model and set, the median absolute
error of TTFT p50/p90 and output tokens/s (relative) and of the hit rate (points), and, on the held-out
points, how often the simulator orders the profiles of one point (same file, workload, load and seed) as
the measurement does, and the held-out errors per file.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgate.sim.fit import CONSTANTS, Point, Setup, evaluate, fit, observations, runnable, setup_from
from fleetgate.sim.profile import PROFILES, SimProfile
from fleetgate.sim.report import quantile

V1_CONSTANTS = (*CONSTANTS, "decode_s_per_ctx_token", "request_overhead_s")


@dataclass(frozen=True, slots=True)
class Model:
    """An engine model the fit compares: the engine's scheduler, the constants fitted, and the simulated text.

    `live_text` False: prompts are simulated at 4 characters per token, the ratio the gateway's scorers assume
    (`charsPerToken` 4), so the simulated gateway knows every engine's KV capacity and every prompt's size exactly.
    True: at the live run's measured ratio (6.48 for Llama 3.1 on these prompts), so the simulated gateway is wrong
    as the live one was: it believes an engine holds 65,536 x 4 characters of prompts (its prefix index forgets
    older prefixes after that, though the engine still holds 1.6x more) and counts every prompt as 1.6x more
    tokens against the prefill-queue scorer's scale. Both move requests of one prefix group off the engine that
    holds it, which costs prefix-cache hits (issue 24: the 'vllm-v1' model's simulated default routing hit
    ~10 points more than the live one, so it fitted step constants too slow for round-robin).
    """

    scheduler: str
    constants: tuple[str, ...]
    live_text: bool = False


MODELS = {"reserve": Model("reserve", CONSTANTS), "vllm-v1": Model("vllm-v1", V1_CONSTANTS),
          "vllm-v1-livetext": Model("vllm-v1", V1_CONSTANTS, live_text=True)}
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B shape: layers x KV heads x head dim x (K, V) x bf16
HBM_BYTES_PER_S = {"h100": 3.35e12, "h200": 4.8e12}  # SXM datasheets; other cards start from the H100's
REQUEST_OVERHEAD_START_S = 0.01


@dataclass(frozen=True, slots=True)
class Card:
    name: str
    train: tuple[Path, ...]
    test: tuple[Path, ...]
    probe: tuple[Path, ...] = ()  # read only for a calibration probe (the constants' start), no points


@dataclass(frozen=True, slots=True)
class Run:
    path: Path
    rows: list[dict[str, Any]]
    setup: Setup


def load_split(path: Path, *, root: Path) -> list[Card]:
    """The cards of a split file; its paths are relative to `root` (the repository)."""
    data = json.loads(path.read_text())
    return [Card(name=name, train=tuple(root / f for f in c["train"]), test=tuple(root / f for f in c["test"]),
                 probe=tuple(root / f for f in c.get("probe", ())))
            for name, c in data["cards"].items()]


def load_run(path: Path, *, max_batched_tokens: int) -> Run:
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    info: dict[str, Any] = {}
    for candidate in (path.with_name(f"{path.stem}-run-info.json"), path.with_name("run-info.json")):
        if candidate.is_file():
            info = json.loads(candidate.read_text())
            break
    setup = setup_from(rows, max_num_seqs=int(info.get("max_num_seqs", 128)),
                       max_batched_tokens=int(info.get("max_num_batched_tokens", max_batched_tokens)))
    return Run(path=path, rows=rows, setup=setup)


def points_of(runs: Sequence[Run], *, profiles: set[str] | None) -> list[tuple[Point, str]]:
    """(point, the file's stem) for every simulable routing point of `runs`."""
    out = []
    for run in runs:
        for obs in observations(run.rows, repeats=True):
            if runnable(obs.profile) and (profiles is None or obs.profile in profiles):
                out.append(((obs, run.setup), run.path.stem))
    return out


def start_profile(runs: Sequence[Run], setup: Setup, *, card: str, scheduler: str) -> SimProfile:
    """The first calibration probe found in `runs` (else `gpu-8b`), on `setup`'s KV and batch limits, for the
    engine model named `scheduler` (a key of `MODELS`)."""
    model = MODELS[scheduler]
    scheduler = model.scheduler
    profile = PROFILES["gpu-8b"]
    cal = next((r for run in runs for r in run.rows if r.get("kind") == "calibration"), None)
    if cal is not None:
        profile = profile.with_(step_overhead_s=max(1e-4, float(cal["step_overhead_s"])),
                                prefill_s_per_token=max(1e-8, float(cal["prefill_s_per_token"])),
                                decode_s_per_seq=max(1e-8, float(cal["decode_s_per_seq"])))
    profile = profile.with_(num_blocks=max(1, setup.capacity_tokens // setup.block_size), block_size=setup.block_size,
                            max_num_seqs=setup.max_num_seqs, max_batched_tokens=setup.max_batched_tokens,
                            chars_per_token=4, time_scale=1.0, scheduler=scheduler)
    if scheduler == "vllm-v1":
        bandwidth = HBM_BYTES_PER_S.get(card, HBM_BYTES_PER_S["h100"])
        profile = profile.with_(decode_s_per_ctx_token=KV_BYTES_PER_TOKEN / bandwidth,
                                request_overhead_s=REQUEST_OVERHEAD_START_S)
    if model.live_text:
        profile = profile.with_(chars_per_token=setup.chars_per_token)
    return profile


def summary(evaluated: list[dict[str, Any]]) -> dict[str, float]:
    """Median absolute relative error per figure, hit rate in points; `n` the points."""
    out: dict[str, float] = {"n": float(len(evaluated))}
    for m in ("ttft_p50_s", "ttft_p90_s", "output_tps"):
        errs = [abs(r[m]["error"]) for r in evaluated if r[m]["error"] is not None]
        out[m] = quantile(errs, 0.5) if errs else math.nan
    diffs = [abs(r["hit_rate"]["simulated"] - r["hit_rate"]["measured"]) for r in evaluated]
    out["hit_rate_points"] = quantile(diffs, 0.5) * 100 if diffs else math.nan
    # unique prompts hit nothing, measured and simulated: the median over points that can hit says more
    shared = [d for d, r in zip(diffs, evaluated, strict=True) if r["hit_rate"]["measured"] > 0]
    out["hit_rate_points_sharing"] = quantile(shared, 0.5) * 100 if shared else math.nan
    return out


def rescore(result: dict[str, Any]) -> dict[str, Any]:
    """Recompute the summaries and orders of a saved result from its points (no simulation)."""
    for entry in result["cards"].values():
        for model in entry["models"].values():
            for set_name in ("train", "test"):
                for r in model[set_name]["points"]:
                    r["group"] = tuple(r["group"])
                model[set_name]["summary"] = summary(model[set_name]["points"])
            model["order"] = {m: ordering(model["test"]["points"], figure=m) for m in ("ttft_p50_s", "ttft_p90_s")}
    return result


def ordering(evaluated: list[dict[str, Any]], *, figure: str, tie: float = 0.1) -> dict[str, int]:
    """Pairs of profiles of one point (same file, workload, load, seed) that the simulator orders as measured.
    Pairs whose measured figures differ by less than `tie` (relative) are counted apart: noise decides them."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in evaluated:
        groups.setdefault(r["group"], []).append(r)
    out = {"pairs": 0, "right": 0, "ties": 0, "points": 0, "points_all_right": 0}
    for rows in groups.values():
        if len(rows) < 2:
            continue
        out["points"] += 1
        all_right = True
        for a, b in itertools.combinations(rows, 2):
            ma, mb = a[figure]["measured"], b[figure]["measured"]
            if abs(ma - mb) < tie * max(ma, mb):
                out["ties"] += 1
                continue
            out["pairs"] += 1
            right = (ma < mb) == (a[figure]["simulated"] < b[figure]["simulated"])
            out["right"] += right
            all_right &= right
        out["points_all_right"] += all_right
    return out


def _tag(evaluated: list[dict[str, Any]], pts: list[tuple[Point, str]]) -> list[dict[str, Any]]:
    for row, ((obs, _), stem) in zip(evaluated, pts, strict=True):
        row["file"] = stem
        row["seed"] = obs.seed
        row["profile"] = obs.profile
        row["group"] = (stem, obs.workload, obs.load, obs.seed)
        row["point"] = f"{stem.removeprefix('gpu-routing-')} {obs.name} seed {obs.seed}"
    return evaluated


async def calibrate(cards: Sequence[Card], *, schedulers: Sequence[str], max_batched_tokens: int = 8192,
                    profiles: set[str] | None = None, passes: int = 2,
                    progress: Callable[[str], None] = print) -> dict[str, Any]:
    every_run = {p: load_run(p, max_batched_tokens=max_batched_tokens)
                 for card in cards for p in (*card.probe, *card.train, *card.test)}
    result: dict[str, Any] = {"cards": {}, "schedulers": list(schedulers)}
    for card in cards:
        train = points_of([every_run[p] for p in card.train], profiles=profiles)
        test = points_of([every_run[p] for p in card.test], profiles=profiles)
        if not train:
            raise ValueError(f"card {card.name}: no simulable training points in {[str(p) for p in card.train]}")
        entry: dict[str, Any] = {"train_files": [p.stem for p in card.train], "test_files": [p.stem for p in card.test],
                                 "n_train": len(train), "n_test": len(test), "models": {}}
        for scheduler in schedulers:
            names = MODELS[scheduler].constants
            if MODELS[scheduler].live_text:  # one simulated text ratio per card: its runs must agree on it
                ratios = {round(setup.chars_per_token, 2) for (_, setup), _ in (*train, *test)}
                if len(ratios) > 1:
                    raise ValueError(f"card {card.name}: runs measured different characters per token {ratios}")
            base = start_profile(list(every_run.values()), train[0][0][1], card=card.name, scheduler=scheduler)
            progress(f"{card.name} / {scheduler}: fitting {', '.join(names)} on {len(train)} points")
            fitted, train_loss = await fit([pt for pt, _ in train], base=base, constants=names, passes=passes,
                                           progress=progress)
            model: dict[str, Any] = {"start": {k: getattr(base, k) for k in names},
                                     "fitted": {k: getattr(fitted, k) for k in names}, "train_loss": train_loss}
            for set_name, pts in (("train", train), ("test", test)):
                evaluated = _tag(await evaluate([pt for pt, _ in pts], fitted), pts)
                model[set_name] = {"summary": summary(evaluated), "points": evaluated}
                progress(f"  {set_name}: {model[set_name]['summary']}")
            model["order"] = {m: ordering(model["test"]["points"], figure=m) for m in ("ttft_p50_s", "ttft_p90_s")}
            entry["models"][scheduler] = model
        result["cards"][card.name] = entry
    return result


def markdown(result: dict[str, Any]) -> str:
    def pct(v: float) -> str:
        return "-" if math.isnan(v) else f"{v:.0%}"

    lines = ["| card | model | set | points | TTFT p50 | TTFT p90 | output tok/s | hit rate (points) | "
             "hit rate, sharing workloads |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for card, entry in result["cards"].items():
        for scheduler, model in entry["models"].items():
            for set_name in ("train", "test"):
                s = model[set_name]["summary"]
                lines.append(f"| {card} | {scheduler} | {set_name} | {int(s['n'])} | {pct(s['ttft_p50_s'])} | "
                             f"{pct(s['ttft_p90_s'])} | {pct(s['output_tps'])} | {s['hit_rate_points']:.1f} | "
                             f"{s.get('hit_rate_points_sharing', math.nan):.1f} |")
    lines += ["", "Order of the profiles of one held-out point (pairs ordered as measured; pairs within 10% "
              "of each other left out as ties):", "",
              "| card | model | TTFT p50 pairs right | TTFT p90 pairs right | points all right (p50) | ties (p50) |",
              "|---|---|---:|---:|---:|---:|"]
    for card, entry in result["cards"].items():
        for scheduler, model in entry["models"].items():
            o50, o90 = model["order"]["ttft_p50_s"], model["order"]["ttft_p90_s"]
            lines.append(f"| {card} | {scheduler} | {o50['right']}/{o50['pairs']} | {o90['right']}/{o90['pairs']} | "
                         f"{o50['points_all_right']}/{o50['points']} | {o50['ties']} |")
    lines += ["", "Held-out points per file (median absolute error; hit rate in points; profile order: p50 and p90 "
              "pairs right):", "", "| card | model | file | points | TTFT p50 | TTFT p90 | output tok/s | hit rate | "
              "order p50 | order p90 |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for card, entry in result["cards"].items():
        for scheduler, model in entry["models"].items():
            files = dict.fromkeys(r["file"] for r in model["test"]["points"])
            for stem in files:
                pts = [r for r in model["test"]["points"] if r["file"] == stem]
                s, o50, o90 = (summary(pts), ordering(pts, figure="ttft_p50_s"), ordering(pts, figure="ttft_p90_s"))
                lines.append(f"| {card} | {scheduler} | {stem.removeprefix('gpu-routing-')} | {int(s['n'])} | "
                             f"{pct(s['ttft_p50_s'])} | {pct(s['ttft_p90_s'])} | {pct(s['output_tps'])} | "
                             f"{s['hit_rate_points']:.1f} | {o50['right']}/{o50['pairs']} | "
                             f"{o90['right']}/{o90['pairs']} |")
    lines += ["", "Fitted constants:", ""]
    for card, entry in result["cards"].items():
        for scheduler, model in entry["models"].items():
            lines.append(f"- {card} / {scheduler}: " + ", ".join(
                f"{k} {model['start'][k]:.4g} -> {model['fitted'][k]:.4g}" for k in model["fitted"]))
    return "\n".join(lines) + "\n"


def points_table(result: dict[str, Any], *, scheduler: str, set_name: str = "test") -> str:
    lines = ["| point | TTFT p50 s | TTFT p90 s | output tok/s | hit rate |", "|---|---|---|---|---|"]
    for entry in result["cards"].values():
        for r in entry["models"][scheduler][set_name]["points"]:
            cells = [f"{r[m]['measured']:.3g} -> {r[m]['simulated']:.3g}"
                     for m in ("ttft_p50_s", "ttft_p90_s", "output_tps", "hit_rate")]
            lines.append(f"| {r['point']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
