"""Limit windows: which counters a request reserves against, and how long a refused caller should wait.

Inputs: a tenant's limits (rpm, tpm, daily and monthly $ budgets in micro-dollars), the wall clock (UTC)
and the request's estimate (1 request, prompt + max_tokens tokens, the dollar cost of those tokens).

Windows:
- rpm, tpm: per minute, as a *sliding window counter* (the Cloudflare/NGINX approximation): the load in
  the window is ``cur + prev * (1 - elapsed / 60s)`` where `cur` and `prev` are the fixed-minute counters
  of this and the previous minute. It needs two integers per limit (atomic INCRBY, no per-request log)
  and removes the 2x burst that plain fixed windows allow at a minute boundary. Set
  `sliding_minute_windows: false` for plain fixed minutes.
- daily and monthly budgets: fixed calendar windows in UTC (a budget is a billing period: "$50 per day"
  resets at 00:00 UTC, "$1000 per month" on the 1st).

Every counter holds settled usage *plus* the estimates of requests still in flight, so a refusal
depends only on one atomic check-and-add over all windows (see the Redis and memory backends).

Retry-After: for a fixed window, the time to its end. For a sliding one, the time until the previous
minute's weight has decayed enough for the request to fit, rolling into the next minute if needed.
Refunds by requests in flight can free room sooner; the value is what the counters say now.
"""

from __future__ import annotations

import calendar
import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime

MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Dollar caps on one requested model name (daily, monthly), in micro-dollars."""

    daily_micros: int | None = None
    monthly_micros: int | None = None


@dataclass(frozen=True, slots=True)
class TenantLimits:
    rpm: int | None = None
    tpm: int | None = None
    daily_micros: int | None = None
    monthly_micros: int | None = None
    models: tuple[tuple[str, ModelLimits], ...] = ()  # per requested model name

    def model(self, name: str) -> ModelLimits | None:
        return next((limits for model, limits in self.models if model == name), None)

    @property
    def any(self) -> bool:
        tenant = (self.rpm, self.tpm, self.daily_micros, self.monthly_micros)
        return bool(self.models) or any(v is not None for v in tenant)


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # rpm | tpm | daily_budget | monthly_budget | model_daily_budget | model_monthly_budget
    key: str
    prev_key: str  # previous minute for sliding windows; "" for fixed ones
    limit: int
    amount: int
    start_ms: int
    window_ms: int
    ttl_ms: int

    @property
    def sliding(self) -> bool:
        return bool(self.prev_key)


@functools.lru_cache(maxsize=4)
def _calendar(day: int) -> tuple[str, str, int, int]:
    """(day id, month id, month start ms, month end ms) of UTC day number `day` (days since the epoch).

    A pure function of the day, memoised: formatting dates and finding month bounds per request cost more
    than the rest of the window plan."""
    d = datetime.fromtimestamp(day * 86400, UTC)
    start_s = int(datetime(d.year, d.month, 1, tzinfo=UTC).timestamp())
    days = calendar.monthrange(d.year, d.month)[1]
    return d.strftime("%Y%m%d"), d.strftime("%Y%m"), start_s * 1000, (start_s + days * 86400) * 1000


def day_id(now_s: float) -> str:
    return _calendar(int(now_s // 86400))[0]


def _day_bounds_ms(now_s: float) -> tuple[int, int]:
    start = int(now_s // 86400) * 86400
    return start * 1000, (start + 86400) * 1000


def _month_bounds_ms(now_s: float) -> tuple[str, int, int]:
    _, month, start_ms, end_ms = _calendar(int(now_s // 86400))
    return month, start_ms, end_ms


def epoch_key(*, prefix: str, tenant_id: str) -> str:
    """The tenant's counter-generation key (`limiter_redis`), in its counters' hash slot."""
    return f"{prefix}lim:{{{tenant_id}}}:epoch"


def plan_checks(
    *,
    prefix: str,
    tenant_id: str,
    limits: TenantLimits,
    now_s: float,
    tokens: int,
    micros: int,
    sliding: bool,
    model: str | None = None,
) -> list[Check]:
    """The counters one request reserves against, in the order they are checked: the tenant's windows,
    then the caps of the requested `model` if the tenant has any (same hash tag, so one atomic step)."""
    base = f"{prefix}lim:{{{tenant_id}}}"  # hash tag: one cluster slot per tenant, so scripts may touch all
    now_ms = int(now_s * 1000)
    minute = now_ms // MINUTE_MS
    m_start = minute * MINUTE_MS
    checks: list[Check] = []
    for name, limit, amount in (("rpm", limits.rpm, 1), ("tpm", limits.tpm, tokens)):
        if limit is None:
            continue
        checks.append(
            Check(
                name=name,
                key=f"{base}:{name}:{minute}",
                prev_key=f"{base}:{name}:{minute - 1}" if sliding else "",
                limit=limit,
                amount=amount,
                start_ms=m_start,
                window_ms=MINUTE_MS,
                ttl_ms=3 * MINUTE_MS,
            )
        )
    if limits.daily_micros is not None:
        d_start, d_end = _day_bounds_ms(now_s)
        checks.append(
            Check("daily_budget", f"{base}:usd_d:{day_id(now_s)}", "", limits.daily_micros, micros,
                  d_start, d_end - d_start, d_end - now_ms + 86_400_000)
        )
    if limits.monthly_micros is not None:
        month, mo_start, mo_end = _month_bounds_ms(now_s)
        checks.append(
            Check("monthly_budget", f"{base}:usd_m:{month}", "", limits.monthly_micros, micros,
                  mo_start, mo_end - mo_start, mo_end - now_ms + 86_400_000)
        )
    capped = limits.model(model) if model is not None else None
    if capped is not None:
        # The model name is configured (never a client's arbitrary string), so it may stand in a key.
        if capped.daily_micros is not None:
            d_start, d_end = _day_bounds_ms(now_s)
            checks.append(
                Check("model_daily_budget", f"{base}:usd_d:m:{model}:{day_id(now_s)}", "", capped.daily_micros,
                      micros, d_start, d_end - d_start, d_end - now_ms + 86_400_000)
            )
        if capped.monthly_micros is not None:
            month, mo_start, mo_end = _month_bounds_ms(now_s)
            checks.append(
                Check("model_monthly_budget", f"{base}:usd_m:m:{model}:{month}", "", capped.monthly_micros,
                      micros, mo_start, mo_end - mo_start, mo_end - now_ms + 86_400_000)
            )
    return checks


def window_load(*, check: Check, cur: int, prev: int, now_ms: int) -> float:
    if not check.sliding:
        return float(cur)
    weight = max(0.0, 1.0 - (now_ms - check.start_ms) / check.window_ms)
    return cur + prev * weight


def retry_after_s(*, check: Check, cur: int, prev: int, now_ms: int) -> float:
    """Seconds until `check.amount` fits, assuming no refunds; a whole window if it never can."""
    window_end = check.start_ms + check.window_ms
    to_end = (window_end - now_ms) / 1000
    if check.amount > check.limit:
        return check.window_ms / 1000
    if not check.sliding:
        return max(to_end, 0.001)
    elapsed = now_ms - check.start_ms
    room = check.limit - cur - check.amount
    if room >= 0 and prev > 0:
        weight_needed = room / prev
        wait_ms = check.window_ms * (1 - weight_needed) - elapsed
        return max(wait_ms / 1000, 0.001)
    # This minute's own counter is too full: wait for the next minute, where it becomes `prev`.
    if cur <= 0:
        return max(to_end, 0.001)
    weight_needed = (check.limit - check.amount) / cur
    into_next_ms = check.window_ms * max(0.0, 1 - weight_needed)
    return max(to_end + into_next_ms / 1000, 0.001)


def describe(check: Check, *, tenant_id: str, load: float, model: str | None = None) -> str:
    used = math.ceil(load)
    if check.name == "rpm":
        what = f"requests-per-minute limit (rpm={check.limit}): {used} requests in the last minute"
    elif check.name == "tpm":
        what = (f"tokens-per-minute limit (tpm={check.limit}): {used} tokens used or reserved in the last "
                f"minute, this request reserves up to {check.amount}")
    else:
        period = "daily" if "daily" in check.name else "monthly"
        scope = f" for model {model!r}" if check.name.startswith("model_") and model else ""
        what = (f"{period} budget{scope} (${check.limit / 1e6:.6f}): ${used / 1e6:.6f} spent or reserved, this "
                f"request may cost up to ${check.amount / 1e6:.6f}")
    if check.amount > check.limit:
        return f"tenant {tenant_id!r}: this request alone exceeds its {what.split(':')[0]}"
    return f"tenant {tenant_id!r} is over its {what}"
