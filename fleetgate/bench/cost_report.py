"""Scoring and reporting for the cost benchmark: a table per configuration, JSON, and markdown with SVG plots."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleetgate.bench.cost_run import ConfigResult


@dataclass(frozen=True, slots=True)
class Row:
    config: str
    requests: int
    errors: int
    usd_per_1k: float
    engine_calls: int
    gpu_seconds: float
    ttft_p50_s: float
    ttft_p90_s: float
    cache_hit_rate: float
    cache_precision: float | None
    wrong_hits: int
    strong_share: float
    strong_recall: float
    prefix_hit_rate: float
    accounted_usd: float | None


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def score(result: ConfigResult, *, large_tier: str = "large") -> Row:
    outcomes = result.outcomes
    ok = [o for o in outcomes if o.status == 200]
    produced: dict[str, set[str]] = {}
    for o in ok:
        if not o.cache.startswith("hit") and o.tag:
            produced.setdefault(o.tag, set()).add(o.item.answer_key)
    hits = [o for o in ok if o.cache.startswith("hit")]
    wrong = [o for o in hits if o.item.answer_key not in produced.get(o.tag or "", set())]
    calls = result.engine_calls
    total_calls = sum(calls.values())
    needs_large = [o for o in ok if o.item.needs_tier == "large" and not o.cache.startswith("hit")]
    recalled = [o for o in needs_large if (o.tier or large_tier) == large_tier]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    return Row(
        config=result.config.name,
        requests=len(outcomes),
        errors=len(outcomes) - len(ok),
        usd_per_1k=sum(result.dollars.values()) / max(1, len(outcomes)) * 1000,
        engine_calls=total_calls,
        gpu_seconds=sum(result.gpu_seconds.values()),
        ttft_p50_s=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p90_s=_pct(ttfts, 0.9),
        cache_hit_rate=len(hits) / max(1, len(ok)),
        cache_precision=(len(hits) - len(wrong)) / len(hits) if hits else None,
        wrong_hits=len(wrong),
        strong_share=calls.get(large_tier, 0) / total_calls if total_calls else 0.0,
        strong_recall=len(recalled) / len(needs_large) if needs_large else 1.0,
        prefix_hit_rate=result.prefix_hit_rate,
        accounted_usd=result.accounted_usd,
    )


def table(rows: list[Row]) -> str:
    base = rows[0]
    head = (f"{'config':<16} {'$/1k req':>9} {'vs naive':>8} {'calls':>6} {'GPU-s':>8} {'TTFT p50':>9} "
            f"{'p50 gain':>8} {'TTFT p90':>9} {'hit rate':>8} {'precision':>9} {'strong':>7} {'recall':>7} "
            f"{'prefix hit':>10} {'errors':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        saving = 1 - r.usd_per_1k / base.usd_per_1k if base.usd_per_1k else 0.0
        gain = base.ttft_p50_s / r.ttft_p50_s if r.ttft_p50_s else float("inf")
        precision = f"{r.cache_precision:.1%}" if r.cache_precision is not None else "-"
        lines.append(
            f"{r.config:<16} {r.usd_per_1k:>9.4f} {-saving:>+8.1%} {r.engine_calls:>6} {r.gpu_seconds:>8.1f} "
            f"{r.ttft_p50_s:>8.3f}s {gain:>7.2f}x {r.ttft_p90_s:>8.3f}s {r.cache_hit_rate:>8.1%} {precision:>9} "
            f"{r.strong_share:>7.1%} {r.strong_recall:>7.1%} {r.prefix_hit_rate:>10.1%} {r.errors:>6}"
        )
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[tuple[str, bool, str]]:
    """The issue's targets for all-on vs naive: (name, met, figure); none when a run left either out
    (`--configs` subsets)."""
    base = next((r for r in rows if r.config == "naive"), None)
    allon = next((r for r in rows if r.config == "all-on"), None)
    if base is None or allon is None:
        return []
    saving = 1 - allon.usd_per_1k / base.usd_per_1k
    gain = base.ttft_p50_s / allon.ttft_p50_s
    precision = allon.cache_precision if allon.cache_precision is not None else 1.0
    return [
        ("$ per 1,000 requests >= 30% lower", saving >= 0.30, f"{saving:.1%} lower"),
        ("TTFT p50 >= 2x better", gain >= 2.0, f"{gain:.2f}x"),
        ("cache precision >= 98%", precision >= 0.98, f"{precision:.1%} ({allon.wrong_hits} wrong hits)"),
        ("strong-tier recall >= 95%", allon.strong_recall >= 0.95, f"{allon.strong_recall:.1%}"),
    ]


def _svg_bars(title: str, labels: list[str], values: list[float], unit: str) -> str:
    width, bar_h, gap, left = 560, 22, 8, 130
    top = max(values) if values and max(values) > 0 else 1.0
    height = 30 + len(values) * (bar_h + gap)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><text x="4" y="16" font-weight="bold">{title}</text>']
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = 26 + i * (bar_h + gap)
        w = (width - left - 90) * value / top
        parts.append(f'<text x="4" y="{y + 15}">{label}</text>'
                     f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#3b6ea5"/>'
                     f'<text x="{left + w + 4:.1f}" y="{y + 15}">{value:.3g} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_outputs(rows: list[Row], *, meta: dict[str, Any], out_dir: Path) -> list[Path]:
    import orjson

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "cost-report.json"
    json_path.write_bytes(orjson.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                        "targets": [{"target": t, "met": m, "figure": f}
                                                    for t, m, f in targets(rows)]},
                                       option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    labels = [r.config for r in rows]
    plots = {
        "cost.svg": _svg_bars("$ per 1,000 requests", labels, [r.usd_per_1k for r in rows], "$"),
        "ttft.svg": _svg_bars("TTFT p50 (simulated seconds)", labels, [r.ttft_p50_s for r in rows], "s"),
        "calls.svg": _svg_bars("Engine calls", labels, [float(r.engine_calls) for r in rows], ""),
    }
    for name, svg in plots.items():
        (out_dir / name).write_text(svg, encoding="utf-8")
    tiers = "; ".join(f"{d['tier']}: {d['throughput']}" for d in meta.get("deployments", []) if "throughput" in d)
    md = ["# FleetGate cost report", "", f"Command: `{meta.get('command', 'fleetgate bench cost')}`", "",
          f"Engine throughput: {meta.get('throughput_mode', 'simulated')}" + (f" ({tiers})" if tiers else ""), "",
          "```", table(rows), "```", "", "## Targets (all-on vs naive)", ""]
    md += [f"- {'met' if m else 'MISSED'}: {t} — {f}" for t, m, f in targets(rows)]
    md += ["", "## Workload", "", "```", orjson.dumps(meta, option=orjson.OPT_INDENT_2).decode(), "```", ""]
    md += [f"![{name}]({name})" for name in plots]
    md_path = out_dir / "cost-report.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return [json_path, md_path, *(out_dir / n for n in plots)]
