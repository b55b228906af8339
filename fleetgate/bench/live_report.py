"""The live routing benchmark's rows as a report: tables per workload and load, the targets, the files.

`write_reports(rows, out_dir=..., info=...)` writes `report.md` (tables and the issue's targets, each
met or missed with its figure) and `throughput.json` (the GPU tier's measured-throughput file, see
`fleetgate.bench.live_throughput`: the calibration probe, the capacity probe and every routing point's
per-replica tokens/s). `python -m fleetgate.bench.live_report RESULTS.jsonl [OUT_DIR] [--info RUN_INFO.json]`
rebuilds both from a results file (e.g. the one a GPU run sent back). The run's engine description, card
and engine configuration come from its `run-info.json`: `--info`, else `run-info.json` beside the results,
else `<results stem>-run-info.json` beside them (how a run's files are kept under `docs/reports/data/`).
Without one, the card is `unknown` and the tool says so.

Targets (issue 24), judged on these rows:
- shared-prefix near saturation (each load >= 1): TTFT p90 >= 3x better than round-robin and output
  tokens/s >= 1.3x round-robin's, for `default` and `precise-prefix`;
- `precise-prefix` >= `default` at every load (TTFT p90 no worse, tokens/s no lower), and better near
  saturation;
- unique prompts: `default` within +-5% of `least-loaded` (TTFT p50, TTFT p90, tokens/s);
- gateway overhead <= 1% of TTFT p50 (the paired probe under load); each overhead row's target and section name its
  background load (`live_overhead.background_label`: shared-prefix at the base rate, or issue 24's reference scale),
  so rows of different backgrounds are never read as one comparison;
- the gateway's own time <= 1% of TTFT p50: a second, different method (the mean of the gateway's own clocks,
  `fleetgate_gateway_own_seconds` total_to_first_byte, over the loaded window: `live_own_time`), beside the paired
  probe's target, which stays as it is;
- accounting exact against the engines' counters (the `accounting` row's verdict).
Issue 27 (rows of `fleetgate.bench.live_epp`, when the run had `--epp-loads`):
- prefix-routing gain through Envoy + EPP within +-10% of the gateway's: per load, each door's TTFT-p50 gain
  (the first `--epp-profiles` profile's TTFT p50 over the last's) and hit-rate gain (last over first), Envoy + EPP's
  divided by the gateway's;
- Envoy + EPP adds <= 2 ms TTFT p50 over Envoy alone (the door-latency probe rounds, idle and under load).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from fleetgate.bench import live_own_time
from fleetgate.bench.live_overhead import REFERENCE_OUTPUT_TOKENS, background_label
from fleetgate.bench.live_routing import accounting_line
from fleetgate.bench.live_throughput import throughput_file

NEAR = 1.0  # loads at or above this multiple of round-robin's capacity are "near saturation"


def control_lines(r: dict[str, Any]) -> list[str]:
    """The overhead phase's control pairs (`live_overhead.control_rows`), beside the gateway's pairs."""
    controls = r.get("controls") or []
    if not controls:
        return []
    lines = ["", "Control pairs (two direct requests, the second sent later by a known offset; what the paired "
             "probe charges a pure delay), against the gateway's pairs "
             f"({_f(r.get('loaded_share_over_5ms'), '.1%')} of them over 5 ms):", "",
             "| offset asked ms | real offset ms | pairs | added ms (95%) | median ms | pairs over 5 ms |",
             "|---:|---:|---:|---|---:|---:|"]
    for c in controls:
        a = c["added_ms"]
        lines.append(f"| {c['offset_ms']:g} | {c['real_offset_ms']:.2f} | {c['pairs']} | +{a[0]:.2f} "
                     f"({a[1]:.2f}..{a[2]:.2f}) | {c['added_median_ms']:.2f} | {c['share_over_5ms']:.1%} |")
    return lines


def _f(value: Any, fmt: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return format(float(value) * scale, fmt)


def _ratio(base: float | None, value: float | None, *, lower_is_better: bool) -> float | None:
    if base is None or value is None or base <= 0 or value <= 0:
        return None
    return base / value if lower_is_better else value / base


def points(rows: list[dict[str, Any]], *, tag: str = "routing") -> dict[tuple[str, float], list[dict[str, Any]]]:
    out: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "point" and r.get("tag") == tag:
            out.setdefault((r["workload"], float(r["load"])), []).append(r)
    return dict(sorted(out.items()))


def drawn_load(row: dict[str, Any]) -> float | None:
    """The load a point's seed really drew: its arrivals over the nominal rate's expectation, times the nominal load.
    Poisson arrivals over a short window differ from the expectation by a few percent, which decides the order of
    profiles past saturation; None for chat (closed loop) and rows without the figures."""
    expected = float(row.get("rate") or 0) * float(row.get("window_s") or 0)
    if row.get("workload") == "chat" or expected <= 0 or not row.get("requests"):
        return None
    return float(row["requests"]) / expected * float(row["load"])


def table(group: list[dict[str, Any]], *, baseline: str) -> list[str]:
    base = next((r for r in group if r["profile"] == baseline), {})
    lines = [f"| profile | requests | drawn load | TTFT p50 s | TTFT p90 s | steady p90 s | output tok/s | hit rate | "
             f"p50 x{baseline} | p90 x{baseline} | tok/s x{baseline} | gw CPU ms/req | requests per engine |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in group:
        p50 = _ratio(base.get("ttft_p50_s"), r["ttft_p50_s"], lower_is_better=True)
        p90 = _ratio(base.get("ttft_p90_s"), r["ttft_p90_s"], lower_is_better=True)
        tps = _ratio(base.get("output_tps"), r["output_tps"], lower_is_better=False)
        lines.append(
            f"| {r['profile']} | {r['requests']} | {_f(drawn_load(r), '.2f')} | {_f(r['ttft_p50_s'], '.3f')} | "
            f"{_f(r['ttft_p90_s'], '.3f')}"
            f"{' (>=, ' + str(r['ttft_censored']) + ' cut off)' if r.get('ttft_censored') else ''} | "
            f"{_f(r['ttft_steady_p90_s'], '.3f')} | {r['output_tps']:,.0f} | {r['hit_rate']:.1%} | {_f(p50, '.2f')} | "
            f"{_f(p90, '.2f')} | {_f(tps, '.2f')} | {r['gateway_cpu_ms_per_request']:.2f} | "
            f"{', '.join(f'{k}: {v}' for k, v in r['spread'].items())} |")
    return lines


PRECISE = ("precise-prefix", "precise-local")  # the precise-routing profiles' names (shared or local tokenizer)


def seed_tags(rows: list[dict[str, Any]]) -> list[str]:
    """The tags of the repeated-seed groups (`LiveOptions.repeat_seeds`), in run order."""
    return list(dict.fromkeys(str(r["tag"]) for r in rows
                              if r.get("kind") == "point" and str(r.get("tag", "")).startswith("seed-")))


def near_saturation_targets(rows: list[dict[str, Any]], *, tag: str = "routing"
                            ) -> list[tuple[str, bool | None, str]]:
    """The shared-prefix targets against round-robin, per load at or past NEAR, of one group of points."""
    out: list[tuple[str, bool | None, str]] = []
    label = "" if tag == "routing" else f" ({tag})"
    for (workload, load), group in points(rows, tag=tag).items():
        profs = {r["profile"]: r for r in group}
        if workload != "shared-prefix" or load < NEAR or "round-robin" not in profs:
            continue
        rr = profs["round-robin"]
        for name in ("default", *PRECISE):
            r = profs.get(name)
            if r is None:
                continue
            p90 = _ratio(rr["ttft_p90_s"], r["ttft_p90_s"], lower_is_better=True)
            tps = _ratio(rr["output_tps"], r["output_tps"], lower_is_better=False)
            out.append((f"shared-prefix x{load:g}{label}: {name} TTFT p90 >= 3x round-robin", None if p90 is None
                        else p90 >= 3.0, f"{_f(p90, '.2f')}x ({_f(r['ttft_p90_s'], '.3f')}s vs "
                        f"{_f(rr['ttft_p90_s'], '.3f')}s)"))
            out.append((f"shared-prefix x{load:g}{label}: {name} output tok/s >= 1.3x round-robin",
                        None if tps is None else tps >= 1.3,
                        f"{_f(tps, '.2f')}x ({r['output_tps']:,.0f} vs {rr['output_tps']:,.0f})"))
    return out


def targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """(target, met (None: not measured), figure)."""
    out = near_saturation_targets(rows)
    for tag in seed_tags(rows):
        out += near_saturation_targets(rows, tag=tag)
    groups = points(rows)
    by = {key: {r["profile"]: r for r in group} for key, group in groups.items()}
    for (workload, load), profs in by.items():
        precise = next((name for name in PRECISE if name in profs), None)
        if workload != "shared-prefix" or precise is None or "default" not in profs:
            continue
        p, d = profs[precise], profs["default"]
        better = (p["ttft_p90_s"] or 0) <= (d["ttft_p90_s"] or 0) and p["output_tps"] >= d["output_tps"] * 0.99
        out.append((f"shared-prefix x{load:g}: {precise} >= default", better,
                    f"TTFT p90 {_f(p['ttft_p90_s'], '.3f')}s vs {_f(d['ttft_p90_s'], '.3f')}s, "
                    f"{p['output_tps']:,.0f} vs {d['output_tps']:,.0f} tok/s"))
    for (workload, load), profs in by.items():
        if workload != "unique" or "default" not in profs or "least-loaded" not in profs:
            continue
        d, ll = profs["default"], profs["least-loaded"]
        devs = {k: (d[k] / ll[k] - 1) if d[k] and ll[k] else None
                for k in ("ttft_p50_s", "ttft_p90_s", "output_tps")}
        ok = all(v is not None and abs(v) <= 0.05 for v in devs.values())
        out.append((f"unique x{load:g}: default within +-5% of least-loaded", ok,
                    ", ".join(f"{k} {_f(v, '+.1%')}" for k, v in devs.items())))
    out += door_targets(rows)
    for r in rows:
        if r.get("kind") == "overhead" and r.get("added_share_of_ttft_p50") is not None:
            share = r["added_share_of_ttft_p50"]
            upper = r["loaded_added_ms"][2] / 1000 / r["background_ttft_p50_s"]
            met = True if upper <= 0.01 else False if share > 0.01 else None  # None: the interval straddles 1%
            replicas = r.get("gateway_replicas", 1)
            door = f", {replicas} gateway replicas" if replicas > 1 else ""
            out.append((f"gateway overhead <= 1% of TTFT p50 ({r.get('profile', 'default')}{door}; "
                        f"{background_label(r)}; mean of paired probes, 95% interval)", met,
                        f"+{r['loaded_added_ms'][0]:.2f} ms (95% {r['loaded_added_ms'][1]:.2f}.."
                        f"{r['loaded_added_ms'][2]:.2f}) = {share:.2%} of {r['background_ttft_p50_s']:.3f}s at "
                        f"{r['output_tps']:,.0f} tok/s"))
        own = live_own_time.target(r, background=background_label(r)) if r.get("kind") == "overhead" else None
        if own is not None:
            out.append(own)
        if r.get("kind") == "accounting":
            out.append(("accounting exact against the engines' counters", r["verdict"] == "PASS",
                        f"lost {r['lost_prompt_tokens']:.0f} prompt / {r['lost_completion_tokens']:.0f} completion "
                        f"tokens over {r['rows']} rows ({r['cancelled']:.0f} cancellations)"))
    return out


GAIN_BAND = (0.9, 1.1)
ADDED_P50_MS = 2.0
EPP_OVER_ALONE = "envoy+epp - envoy alone"


def door_gains(rows: list[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """Per load of the door points: each door's gain of the last profile over the first (`ttft`: the first's TTFT p50
    / the last's; `hit`: the last's hit rate / the first's), Envoy + EPP's gain over the gateway's (`ttft_ratio`,
    `hit_ratio`), the last profile's hit rate through Envoy + EPP over through the gateway (`shipped_hit_ratio`) and
    the door cost (the last profile's TTFT p50 through Envoy + EPP minus through the gateway)."""
    meta = next((r for r in rows if r.get("kind") == "meta"), {})
    order = list(meta.get("options", {}).get("epp_profiles") or [])
    out: dict[float, dict[str, Any]] = {}
    for (_, load), group in points(rows, tag="door").items():
        by = {(r.get("door", "gateway"), r["profile"]): r for r in group}
        names = order or list(dict.fromkeys(r["profile"] for r in group))
        if len(names) < 2:
            continue
        first, last = names[0], names[-1]
        entry: dict[str, Any] = {"base": first, "shipped": last}
        for door in ("gateway", "envoy+epp"):
            a, b = by.get((door, first)), by.get((door, last))
            entry[door] = None if a is None or b is None else {
                "ttft": _ratio(a["ttft_p50_s"], b["ttft_p50_s"], lower_is_better=True),
                "hit": b["hit_rate"] / a["hit_rate"] if a["hit_rate"] else None}
        g, e = entry["gateway"], entry["envoy+epp"]
        entry["ttft_ratio"] = _ratio(g["ttft"], e["ttft"], lower_is_better=False) if g and e else None
        entry["hit_ratio"] = _ratio(g["hit"], e["hit"], lower_is_better=False) if g and e else None
        gl, el = by.get(("gateway", last)), by.get(("envoy+epp", last))
        entry["door_cost_ms"] = ((el["ttft_p50_s"] - gl["ttft_p50_s"]) * 1000 if gl and el and gl["ttft_p50_s"]
                                 is not None and el["ttft_p50_s"] is not None else None)
        # the last profile's hit rates compared directly: the routing through each door without the prefix-blind
        # baseline's noise (docs/reports/epp.md)
        entry["shipped_hit_ratio"] = (_ratio(gl["hit_rate"], el["hit_rate"], lower_is_better=False) if gl and el
                                      else None)
        out[load] = entry
    return out


def door_targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    out: list[tuple[str, bool | None, str]] = []
    for load, g in door_gains(rows).items():
        ratio = g["ttft_ratio"]
        out.append((f"shared-prefix x{load:g}: prefix-routing gain ({g['shipped']} over {g['base']}) through Envoy + "
                    f"EPP within +-10% of the gateway's", None if ratio is None else
                    GAIN_BAND[0] <= ratio <= GAIN_BAND[1],
                    f"TTFT-gain ratio {_f(ratio, '.3f')}, hit-rate ratio {_f(g['hit_ratio'], '.3f')} ({g['shipped']}'s "
                    f"hit rate through Envoy + EPP / the gateway: {_f(g['shipped_hit_ratio'], '.3f')}); door cost "
                    f"{_f(g['door_cost_ms'], '+.1f')} ms"))
    for r in rows:
        if r.get("kind") != "door-latency":
            continue
        idle, loaded = r["idle"][EPP_OVER_ALONE], r["loaded"][EPP_OVER_ALONE]
        out.append((f"Envoy + EPP adds <= {ADDED_P50_MS:g} ms TTFT p50 over Envoy alone (idle, {r['profile']})",
                    None if idle["p50_ms"] is None else idle["p50_ms"] <= ADDED_P50_MS,
                    f"p50 {_f(idle['p50_ms'], '+.2f')} ms, p90 {_f(idle['p90_ms'], '+.2f')} ms over {idle['n']} "
                    "rounds"))
        # Under load the ways of a round go at once and mostly join the same engine step, so their p50 shows the
        # response path alone; the mean counts the rounds where the door's delay missed a step (`Prober.pairs`).
        mean = loaded.get("mean_ms")
        met = None if not mean else True if mean[2] <= ADDED_P50_MS else False if mean[0] > ADDED_P50_MS else None
        out.append((f"Envoy + EPP adds <= {ADDED_P50_MS:g} ms TTFT over Envoy alone (under load, {r['profile']}; "
                    "mean of at-once rounds, 95% interval)", met,
                    "-" if not mean else f"mean {mean[0]:+.2f} ms ({mean[1]:+.2f}..{mean[2]:+.2f}), p50 "
                    f"{_f(loaded['p50_ms'], '+.2f')}, p90 {_f(loaded['p90_ms'], '+.2f')} over {loaded['n']} rounds"))
    return out


def door_section(rows: list[dict[str, Any]]) -> list[str]:
    """The issue-27 section: the door points' tables and gains, the door-latency figures."""
    md: list[str] = []
    gains = door_gains(rows)
    for (_, load), group in points(rows, tag="door").items():
        md += [f"### shared-prefix x{load:g} through both doors ({group[0]['rate']:.2f} req/s, "
               f"{group[0]['window_s']:g} s, the same requests in every row)", "",
               "| door | profile | requests | errors | TTFT p50 s | TTFT p90 s | steady p90 s | output tok/s | "
               "hit rate | door CPU ms/req |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted(group, key=lambda r: (r.get("door", "gateway"), r["profile"])):
            md.append(f"| {r.get('door', 'gateway')} | {r['profile']} | {r['requests']} | {r['errors']} | "
                      f"{_f(r['ttft_p50_s'], '.3f')} | {_f(r['ttft_p90_s'], '.3f')} | "
                      f"{_f(r['ttft_steady_p90_s'], '.3f')} | {r['output_tps']:,.0f} | {r['hit_rate']:.1%} | "
                      f"{r['gateway_cpu_ms_per_request']:.2f} |")
        g = gains.get(load)
        if g:
            for door in ("gateway", "envoy+epp"):
                d = g[door]
                md.append(f"- gain through {door} ({g['shipped']} over {g['base']}): " + (
                    "-" if d is None else f"TTFT p50 x{_f(d['ttft'], '.2f')}, hit rate x{_f(d['hit'], '.2f')}"))
            md += [f"- Envoy + EPP's gain / the gateway's: TTFT p50 {_f(g['ttft_ratio'], '.3f')}, hit rate "
                   f"{_f(g['hit_ratio'], '.3f')} (target {GAIN_BAND[0]:g}-{GAIN_BAND[1]:g}); {g['shipped']}'s hit "
                   f"rate through Envoy + EPP / through the gateway {_f(g['shipped_hit_ratio'], '.3f')}; door cost "
                   f"{_f(g['door_cost_ms'], '+.1f')} ms ({g['shipped']}'s TTFT p50, Envoy + EPP minus gateway)"]
        md.append("")
    for r in rows:
        if r.get("kind") != "door-latency":
            continue
        md += [f"### Added TTFT per door ({r['profile']} profile; probe rounds to one engine: straight, through Envoy "
               f"alone, through Envoy + EPP and through the gateway)", "",
               f"Idle: {r['idle_rounds']} rounds, one request after the other. Loaded: {r['loaded_rounds']} rounds, "
               f"all at once, while Envoy + EPP relayed the shared-prefix workload at {r['rate']:.2f} req/s "
               f"({r['background_requests']} requests, {r['background_errors']} errors, TTFT p50 "
               f"{_f(r['background_ttft_p50_s'], '.3f')} s). ms, per round:", "",
               "| comparison | idle p50 | idle p90 | idle mean (95%) | loaded p50 | loaded p90 | loaded mean (95%) |",
               "|---|---:|---:|---:|---:|---:|---:|"]

        def cells(fig: dict[str, Any]) -> str:
            mean = fig.get("mean_ms")
            return (f"{_f(fig['p50_ms'], '+.2f')} | {_f(fig['p90_ms'], '+.2f')} | " +
                    (f"{mean[0]:+.2f} ({mean[1]:+.2f}..{mean[2]:+.2f})" if mean else "-"))

        for name in r["loaded"]:
            md.append(f"| {name} | {cells(r['idle'][name])} | {cells(r['loaded'][name])} |")
        md += ["", f"CPU per request under load: picker {r['picker_cpu_ms_per_request']:.2f} ms + its Envoy "
               f"{r['epp_envoy_cpu_ms_per_request']:.2f} ms; Envoy alone {r['alone_envoy_cpu_ms_per_request']:.2f} "
               f"ms; gateway {r['gateway_cpu_ms_per_request']:.2f} ms (probes only). Host: {r['cpus']} CPUs, load "
               f"average {r['load_average']:.1f}; client loop lag p99 {r['client_loop_lag_p99_s'] * 1000:.1f} ms.",
               ""]
    return (["## Envoy + EPP against the gateway (issue 27)", "", *md]) if md else []


def gateway_loop_line(loop: dict[str, Any] | None) -> str:
    """The gateway's own event loop over the loaded window (`loop_watch.summary`), or nothing for older rows."""
    if not loop or not loop.get("samples"):
        return ""
    lag, gc = loop["lag_ms"], loop["gc"]
    collections = ", ".join(f"gen {g}: {v['count']} (longest {v['max_ms']:.1f} ms)" for g, v in gc.items())
    return (f" Gateway loop lag (a timer every {loop['every_ms']:g} ms): mean {lag['mean']:.2f} ms, p90 "
            f"{lag['p90']:.2f}, p99 {lag['p99']:.2f}, longest {lag['max']:.1f}; GC collections {collections}.")


def door_line(meta: dict[str, Any]) -> str:
    """How many gateway processes served each door, and what state they shared."""
    n = int(meta.get("gateway_replicas") or 1)
    redis = meta.get("redis_server")
    if n == 1 and not redis:
        return "Gateway: one process per door, state in memory."
    return (f"Gateway: {n} replica process{'es' if n > 1 else ''} per door sharing one redis-server started for the "
            f"door (tenancy, limits, usage ledger, prefix index); requests and probes go to them in turn, the door's "
            f"CPU is their sum.")


def background_sentence(r: dict[str, Any]) -> str:
    """What loaded the engines while the loaded pairs ran."""
    ran_out = r.get("background_chains_ran_out") or 0
    if r.get("background") == "reference":
        return (f"Background: issue 24's reference scale, {r.get('streams')} closed-loop streams through the door "
                f"(one request after another, no think time), each request a unique prompt of "
                f"{_f(r.get('background_prompt_tokens_mean'), ',.0f')} prompt tokens on average and "
                f"{REFERENCE_OUTPUT_TOKENS} output tokens; "
                f"{r['background_requests']} requests." + (
                    f" {ran_out} streams ran out of requests before the window ended (the background thinned)."
                    if ran_out else ""))
    return (f"Background: the shared-prefix workload at the base rate (open loop, Poisson arrivals); "
            f"{r['background_requests']} requests.")


def replica_lines(r: dict[str, Any]) -> list[str]:
    """An overhead row's figures per gateway replica (rows of several replicas, or with Redis)."""
    if "gateway_cpu_s_each" not in r:
        return []
    each = ", ".join(f"replica {x['replica']}: +{_f(x['added_ms'], '.2f')} ms over {x['pairs']} pairs"
                     for x in r.get("loaded_added_by_replica_ms") or [])
    cpu = ", ".join(f"{c:.2f}" for c in r["gateway_cpu_s_each"])
    redis = r.get("redis_cpu_s")
    loops = [gateway_loop_line(loop) for loop in r.get("gateway_loops") or []]
    return ["", f"{r['gateway_replicas']} gateway replica(s): loaded added time {each or '-'}; CPU s per replica "
            f"{cpu} (Redis {_f(redis, '.2f')} s apart); ledger "
            f"{'shared' if r.get('usage_shared') else 'NOT shared: charges summed per replica'}."
            + "".join(f" Replica {i}:{line}" for i, line in enumerate(loops) if line)]


def markdown(rows: list[dict[str, Any]], *, info: dict[str, Any]) -> str:
    meta = next((r for r in rows if r.get("kind") == "meta"), {})
    cap = next((r for r in rows if r.get("kind") == "capacity"), None)
    cal = next((r for r in rows if r.get("kind") == "calibration"), None)
    md = ["# Live routing benchmark", "", f"Engines: {info.get('engine_desc', info.get('engine', '?'))}; "
          f"{meta.get('replicas', '?')} replicas serving `{meta.get('model', '?')}`, KV "
          f"{meta.get('kv_capacity_tokens', '?')} tokens each, {_f(meta.get('chars_per_token'), '.2f')} "
          "chars/token; "
          f"{meta.get('groups', '?')} shared-prefix groups; host {meta.get('cpus', '?')} CPUs, load average "
          f"{_f(meta.get('load_average'), '.1f')} at the start.", ""]
    md += [door_line(meta), ""]
    if meta.get("unknown_profiles"):
        md += [f"Profiles not available in this build: {', '.join(meta['unknown_profiles'])}.", ""]
    if cal:
        md += [f"Calibration (one engine): prefill {cal['prefill_s_per_token'] * 1e6:.1f} us/token "
               f"(TTFT intercept {cal['ttft_intercept_s'] * 1000:.1f} ms), TPOT = "
               f"{cal['step_overhead_s'] * 1000:.2f} ms + {cal['decode_s_per_seq'] * 1000:.3f} ms x batch.", ""]
    if cap:
        md += [f"Round-robin capacity (closed loop, {cap['concurrency']} streams straight to the engines): "
               f"**{cap['base_rate']:.2f} req/s**, {cap['output_tps']:,.0f} output tok/s, hit rate "
               f"{cap['hit_rate']:.1%}. Loads below are multiples of it.", ""]
    for tag in ["routing", *seed_tags(rows)]:
        for (workload, load), group in points(rows, tag=tag).items():
            baseline = "least-loaded" if workload == "unique" else "round-robin"
            rate = group[0]["rate"]
            md += [f"## {workload} x{load:g}{'' if tag == 'routing' else ', ' + tag} ({rate:.2f} "
                   f"{'users/s' if workload == 'chat' else 'req/s'}, {group[0]['window_s']:g} s)", ""]
            md += table(group, baseline=baseline)
            md.append("")
    md += ["## Targets", ""]
    for name, met, figure in targets(rows):
        verdict = "met" if met else "not settled" if met is None else "MISSED"
        md.append(f"- {verdict}: {name} — {figure}")
    for r in rows:
        if r.get("kind") == "overhead":
            replicas = r.get("gateway_replicas", 1)
            md += ["", f"## Gateway at engine speed ({r.get('profile', 'default')}"
                   + (f", {replicas} gateway replicas" if replicas > 1 else "") + f"; {background_label(r)})", "",
                   background_sentence(r), "",
                   f"Paired TTFT probes (gateway minus direct, sent at once to the same engine, same-shaped cached "
                   f"prompt), mean with 95% interval and median: idle +{r['idle_added_ms'][0]:.2f} ms "
                   f"({r['idle_added_ms'][1]:.2f}..{r['idle_added_ms'][2]:.2f}; median "
                   f"{r['idle_added_median_ms'][0]:.2f}) over {r['idle_pairs']} pairs; under load "
                   f"+{r['loaded_added_ms'][0]:.2f} ms ({r['loaded_added_ms'][1]:.2f}..{r['loaded_added_ms'][2]:.2f}; "
                   f"median {r['loaded_added_median_ms'][0]:.2f}, p90 {_f(r['loaded_added_p90_ms'], '.2f')}) over "
                   f"{r['loaded_pairs']} pairs while the engines generated {r['output_tps']:,.0f} tok/s; background "
                   f"TTFT p50 {_f(r['background_ttft_p50_s'], '.3f')} s, p90 "
                   f"{_f(r.get('background_ttft_p90_s'), '.3f')} s. "
                   f"Gateway CPU: {r['gateway_cpu_ms_per_request']:.2f} ms per request, "
                   f"{r['gateway_cpu_ms_per_1k_output_tokens']:.2f} ms per 1k output tokens. Client loop lag p99 "
                   f"{r['client_loop_lag_p99_s'] * 1000:.1f} ms.{gateway_loop_line(r.get('gateway_loop'))}"]
            md += live_own_time.report_lines(r)
            md += control_lines(r)
            md += replica_lines(r)
        if r.get("kind") == "accounting":
            md += ["", "## Accounting", "", accounting_line(r)]
    door = door_section(rows)
    if door:
        md += ["", *door[:-1]]
    skipped = [r for r in rows if r.get("kind") in ("skipped", "error")]
    if skipped:
        md += ["", "## Skipped or failed", ""] + [f"- {r['point']}: {r.get('why') or r.get('error')}" for r in skipped]
    return "\n".join(md) + "\n"


def write_reports(rows: list[dict[str, Any]], *, out_dir: Path, engine: str = "", info: dict[str, Any] | None = None
                  ) -> list[Path]:
    info = {"engine_desc": engine, **(info or {})}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.md"]
    paths[0].write_text(markdown(rows, info=info), encoding="utf-8")
    data = throughput_file(rows, info)
    if data is not None:
        path = out_dir / "throughput.json"
        path.write_text(data.to_json(), encoding="utf-8")
        paths.append(path)
    return paths


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_info_path(results: Path, explicit: Path | None = None) -> Path | None:
    """The run-info file of a results file: the one named, else `run-info.json` beside it, else
    `<stem>-run-info.json` beside it (a kept copy renamed after its run); None when there is none."""
    if explicit is not None:
        if not explicit.is_file():
            raise FileNotFoundError(f"no run-info file at {explicit}")
        return explicit
    for candidate in (results.with_name("run-info.json"), results.with_name(f"{results.stem}-run-info.json")):
        if candidate.is_file():
            return candidate
    return None


USAGE = "usage: python -m fleetgate.bench.live_report RESULTS.jsonl [OUT_DIR] [--info RUN_INFO.json]"


def main(argv: list[str]) -> int:
    args = list(argv)
    explicit: Path | None = None
    if "--info" in args:
        at = args.index("--info")
        if at + 1 >= len(args):
            print(USAGE, file=sys.stderr)
            return 2
        explicit = Path(args[at + 1])
        del args[at:at + 2]
    if not args or len(args) > 2:
        print(USAGE, file=sys.stderr)
        return 2
    results = Path(args[0])
    rows = read_rows(results)
    try:
        info_path = run_info_path(results, explicit)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path is not None else {}
    if info_path is None:
        print(f"warning: no run-info.json beside {results} (nor {results.stem}-run-info.json): the engine, card "
              "and engine configuration are unknown in the report and the throughput file; pass --info",
              file=sys.stderr)
    out = Path(args[1]) if len(args) > 1 else results.parent
    for p in write_reports(rows, out_dir=out, engine=str(info.get("engine_desc", "")), info=info):
        print(f"{time.strftime('%H:%M:%S')} wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
