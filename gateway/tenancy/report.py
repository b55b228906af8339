"""Usage reports from ledger rows: totals by day, tenant, model and tier, as JSON-ready dicts or CSV.

Sums are over integers (tokens, micro-dollars); dollars appear beside them as display values computed
once from the integer total (`*_usd`), so a report's totals equal the sum of its rows exactly.

LoRA adapters: a row's `model` is what the client asked for, so an adapter has rows of its own; `base`
(given `adapters`: adapter -> base model, as discovery knows them when the report is made) names its base
model, and is "" for every other row. `by_base` totals each base model with its adapters: the spend of
one deployment, split in `by_model`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, timedelta
from typing import Any

from fleetgate.core.errors import InvalidRequestError
from fleetgate.gateway.tenancy.ledger import FIELDS, UsageRow
from fleetgate.gateway.tenancy.pricing import MICROS_PER_USD, micros_to_usd

MAX_DAYS = 400
KEY_COLUMNS = ("date", "tenant", "model", "tier", "base")
MICRO_FIELDS = ("cost_micros", "saved_cache_micros", "saved_tier_micros")


def day_range(*, start: str | None, end: str | None, today: date) -> list[str]:
    try:
        last = date.fromisoformat(end) if end else today
        first = date.fromisoformat(start) if start else last - timedelta(days=29)
    except ValueError as exc:
        raise InvalidRequestError(f"dates must be YYYY-MM-DD: {exc}", param="start" if start else "end") from exc
    if first > last:
        raise InvalidRequestError("start is after end", param="start")
    n = (last - first).days + 1
    if n > MAX_DAYS:
        raise InvalidRequestError(f"at most {MAX_DAYS} days per query, asked for {n}", param="start")
    return [(first + timedelta(days=i)).isoformat() for i in range(n)]


def _with_usd(values: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = dict(values)
    for name in MICRO_FIELDS:
        out[name.replace("_micros", "_usd")] = values.get(name, 0) / MICROS_PER_USD
    return out


def _sum(rows: Iterable[UsageRow]) -> dict[str, int]:
    total = dict.fromkeys(FIELDS, 0)
    for r in rows:
        for name in FIELDS:
            total[name] += r.values.get(name, 0)
    return total


def _group(rows: Sequence[UsageRow], attr: str, key: Any = None) -> list[dict[str, Any]]:
    groups: dict[str, list[UsageRow]] = {}
    for r in rows:
        groups.setdefault(key(r) if key is not None else getattr(r, attr), []).append(r)
    name = "date" if attr == "day" else attr
    return [{name: k, **_with_usd(_sum(v))} for k, v in sorted(groups.items())]


def usage_json(
    rows: Sequence[UsageRow], *, days: Sequence[str], scope: str, adapters: Mapping[str, str] | None = None
) -> dict[str, Any]:
    bases = adapters or {}
    return {
        "object": "usage.report",
        "scope": scope,  # a tenant id, or "all" for the admin
        "start": days[0],
        "end": days[-1],
        "totals": _with_usd(_sum(rows)),
        "by_day": _group(rows, "day"),
        "by_tenant": _group(rows, "tenant"),
        "by_model": [{**g, "base": bases.get(g["model"], "")} for g in _group(rows, "model")],
        "by_base": _group(rows, "base", key=lambda r: bases.get(r.model, r.model)),
        "by_tier": _group(rows, "tier"),
        "data": [
            {"date": r.day, "tenant": r.tenant, "model": r.model, "base": bases.get(r.model, ""), "tier": r.tier,
             **_with_usd(r.values)}
            for r in rows
        ],
    }


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """A text cell that a spreadsheet shows as text: a leading `'` keeps a cell starting with a formula
    character (=, +, -, @, tab, CR) from being evaluated (OWASP's CSV injection advice)."""
    return "'" + value if value.startswith(FORMULA_PREFIXES) else value


def usage_csv(rows: Sequence[UsageRow], *, adapters: Mapping[str, str] | None = None) -> str:
    bases = adapters or {}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")  # RFC 4180; a CR or LF inside a cell is then quoted
    usd_cols = [n.replace("_micros", "_usd") for n in MICRO_FIELDS]
    writer.writerow([*KEY_COLUMNS, *FIELDS, *usd_cols])
    for r in rows:
        writer.writerow([*(csv_text(v) for v in (r.day, r.tenant, r.model, r.tier, bases.get(r.model, ""))),
                         *(r.values.get(n, 0) for n in FIELDS),
                         *(micros_to_usd(r.values.get(n, 0)) for n in MICRO_FIELDS)])
    return buf.getvalue()
