"""One report over several sweeps: an earlier call's results beside this one's, compared with today's plan.

GPU time comes in short calls, so the tier's report and throughput file cover every call: `load_previous`
reads an earlier `results.jsonl` (the first line is its header), and `merge` takes, per configuration of
the matrix, this call's record when it ran here (anything but `not_run`), else the earlier call's. An
earlier record keeps vLLM's own figures (`vllm_log`, parsed from its log when it ran) but its plan side is
recomputed with the current code (`recompare`): a fix to the plan is judged against every log measured so
far, and the record says which call measured it (`call`: the header's `started_at`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetgate.bench.gpu.compare import compare, within_target
from fleetgate.bench.gpu.matrix import SweepConfig
from fleetgate.bench.gpu.render import render
from fleetgate.engine.vllm_log import EngineLogReport
from fleetgate.operator.profiles import Profiles


def load_previous(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(header, records by name) of an earlier sweep's results.jsonl; the last record of a name wins."""
    header: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item.get("name") == "__sweep__":
            header = item
        else:
            records[item["name"]] = item
    return header, records


def recompare(record: dict[str, Any], *, config: SweepConfig, profiles: Profiles) -> dict[str, Any]:
    """`record` with its plan and comparison recomputed from the config's spec and vLLM's logged figures."""
    logged = record.get("vllm_log")
    if not logged or config.expect != "serve":
        return record
    rendered = render(name=config.name, spec=config.spec, profiles=profiles)
    plan = rendered.resolved.plan if rendered.resolved is not None else None
    if plan is None:
        return record
    report = EngineLogReport(**logged)
    out = {**record, "plan": plan.to_status(), "plan_recomputed": True}
    if report.kv_tokens is not None:
        figures = compare(plan=plan, log=report)
        out["comparison"] = {k: v.to_dict() for k, v in figures.items()}
        out["within_5pct"] = within_target(figures)
    return out


def merge(
    *, configs: list[SweepConfig], current: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]],
    previous_call: str, profiles: Profiles,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per configuration (matrix order): this call's record if it ran, else the earlier one, recompared."""
    merged: dict[str, dict[str, Any]] = {}
    for config in configs:
        mine = current.get(config.name)
        earlier = previous.get(config.name)
        if mine is not None and (mine.get("status") != "not_run" or earlier is None):
            merged[config.name] = mine
        elif earlier is not None:
            merged[config.name] = {**recompare(earlier, config=config, profiles=profiles), "call": previous_call}
    return merged
