"""Budget windows: the memoised calendar gives the same ids and bounds as computing them per request."""

from __future__ import annotations

import calendar
import random
from datetime import UTC, datetime

from fleetgate.gateway.tenancy.limiter_windows import TenantLimits, day_id, plan_checks


def test_day_and_month_windows_match_the_calendar_across_years_and_leap_days() -> None:
    rng = random.Random(7)
    instants = [rng.uniform(0, 4_102_444_800) for _ in range(3000)]  # 1970..2100
    instants += [951_782_400.0 - 0.001, 951_782_400.0, 951_868_799.999]  # around 2000-02-29
    for now_s in instants:
        d = datetime.fromtimestamp(now_s, UTC)
        assert day_id(now_s) == d.strftime("%Y%m%d")
        checks = plan_checks(prefix="p:", tenant_id="t", limits=TenantLimits(daily_micros=1, monthly_micros=1),
                             now_s=now_s, tokens=1, micros=1, sliding=True)
        daily, monthly = checks
        start = datetime(d.year, d.month, 1, tzinfo=UTC).timestamp()
        assert monthly.key.endswith(d.strftime(":%Y%m")) and daily.key.endswith(d.strftime(":%Y%m%d"))
        assert monthly.start_ms == int(start) * 1000
        assert monthly.window_ms == calendar.monthrange(d.year, d.month)[1] * 86_400_000
        assert monthly.start_ms <= now_s * 1000 < monthly.start_ms + monthly.window_ms
