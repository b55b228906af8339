"""Scoring and reporting for the LoRA configurations of the cost benchmark: a table with ratios against
`deployments` (measured in the same run), the issue's targets, and JSON and markdown files."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleetgate.bench.cost_lora_run import LoraResult
from fleetgate.bench.cost_report import _pct

BASELINE = "deployments"


@dataclass(frozen=True, slots=True)
class LoraRow:
    config: str
    requests: int
    errors: int
    gpus: int
    usd_per_1k: float
    ttft_p50_s: float
    ttft_p90_s: float
    utilisation: float  # work done / provisioned replica time
    disk_loads: int
    slot_swaps: int


def score_lora(result: LoraResult) -> LoraRow:
    ok = [o for o in result.outcomes if o.status == 200]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    n = len(result.outcomes)
    return LoraRow(
        config=result.config.name,
        requests=n,
        errors=n - len(ok),
        gpus=result.gpus,
        usd_per_1k=result.provisioned_usd / max(1, n) * 1000,
        ttft_p50_s=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p90_s=_pct(ttfts, 0.9),
        utilisation=result.work_s / result.provisioned_s if result.provisioned_s else 0.0,
        disk_loads=result.disk_loads,
        slot_swaps=result.slot_swaps,
    )


def lora_table(rows: list[LoraRow]) -> str:
    base = next((r for r in rows if r.config == BASELINE), rows[0])
    head = (
        f"{'config':<18} {'GPUs':>5} {'$/1k req':>9} {'vs deployments':>14} {'TTFT p50':>9} {'p50 ratio':>9} "
        f"{'TTFT p90':>9} {'p90 ratio':>9} {'util':>6} {'loads':>6} {'swaps':>6} {'errors':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        saving = 1 - r.usd_per_1k / base.usd_per_1k if base.usd_per_1k else 0.0
        lines.append(
            f"{r.config:<18} {r.gpus:>5} {r.usd_per_1k:>9.4f} {-saving:>+14.1%} {r.ttft_p50_s:>8.3f}s "
            f"{r.ttft_p50_s / base.ttft_p50_s:>8.2f}x {r.ttft_p90_s:>8.3f}s {r.ttft_p90_s / base.ttft_p90_s:>8.2f}x "
            f"{r.utilisation:>6.1%} {r.disk_loads:>6} {r.slot_swaps:>6} {r.errors:>6}"
        )
    return "\n".join(lines)


def lora_targets(rows: list[LoraRow]) -> list[tuple[str, bool, str]]:
    """The issue's targets: (name, met, figure); those whose configurations the run left out are omitted."""
    by = {r.config: r for r in rows}
    dep, aff, blind = by.get(BASELINE), by.get("adapters+affinity"), by.get("adapters+blind")
    out: list[tuple[str, bool, str]] = []
    if dep is not None and aff is not None:
        saving = 1 - aff.usd_per_1k / dep.usd_per_1k
        ratio = aff.ttft_p50_s / dep.ttft_p50_s
        out.append(("adapters on a shared base >= 60% cheaper per 1k requests", saving >= 0.60, f"{saving:.1%}"))
        out.append(("at TTFT p50 within 1.5x of one deployment per fine-tune", ratio <= 1.5, f"{ratio:.2f}x"))
    if aff is not None and blind is not None:
        gain = blind.ttft_p90_s / aff.ttft_p90_s
        out.append(
            (
                "adapter-affinity beats adapter-blind least-loaded on TTFT p90",
                aff.ttft_p90_s < blind.ttft_p90_s,
                f"{aff.ttft_p90_s:.3f}s vs {blind.ttft_p90_s:.3f}s ({gain:.2f}x)",
            )
        )
    return out


def write_lora_outputs(rows: list[LoraRow], *, meta: dict[str, Any], sizing: str, out_dir: Path) -> list[Path]:
    import orjson

    out_dir.mkdir(parents=True, exist_ok=True)
    targets = lora_targets(rows)
    json_path = out_dir / "cost-report-lora.json"
    json_path.write_bytes(
        orjson.dumps(
            {
                "meta": meta,
                "rows": [asdict(r) for r in rows],
                "targets": [{"target": t, "met": m, "figure": f} for t, m, f in targets],
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    md = [
        "# FleetGate cost report: N fine-tunes as N deployments vs N adapters on one base",
        "",
        f"Command: `{meta.get('command', 'fleetgate bench cost --lora')}`",
        "",
        "```",
        lora_table(rows),
        "```",
        "",
        "## Targets",
        "",
    ]
    md += [f"- {'met' if m else 'MISSED'}: {t}: {f}" for t, m, f in targets]
    md += [
        "",
        "## Sizing as the load grows (same rule, no run)",
        "",
        "```",
        sizing,
        "```",
        "",
        "## Workload and fleet",
        "",
        "```",
        orjson.dumps(meta, option=orjson.OPT_INDENT_2).decode(),
        "```",
        "",
    ]
    md_path = out_dir / "cost-report-lora.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return [json_path, md_path]
