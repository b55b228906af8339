"""The usage ledger: integer totals per (UTC day, tenant, model, tier), in Redis or in memory.

Every finished request adds a handful of integer fields (requests, tokens by kind, micro-dollars charged
and saved) to its row. On Redis one Lua script does all the HINCRBYs of a request, registers the tenant
in the day's tenant set and refreshes the retention TTL, atomically, so replicas never lose an update and
a reader never sees half a request. An addition may carry a one-time token: the accountant retries
additions that failed on a store outage, and a retry of one that did land (a timeout after Redis
applied it) is then dropped instead of counted twice. Rows are keyed `{prefix}usage:{<day>}:<tenant>`
(the day is the hash tag, so one day's rows share a Redis Cluster slot) with fields
`<model>\\t<tier>\\t<field>`, where model and tier are percent-escaped (`%`, tab, CR, LF), so no name can
break the split. Reading skips (and logs) any field that does not parse, so one odd row can never fail a
usage report. (Model names are bounded before they get here: the gateway records refused and unknown
names under a placeholder.)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from fleetgate.gateway.tenancy.redis_client import guarded

if TYPE_CHECKING:
    from redis.asyncio import Redis

FIELDS = (
    "requests",
    "errors",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_prompt_tokens",
    "cache_completion_tokens",
    "cost_micros",
    "saved_cache_micros",
    "saved_tier_micros",
)
SEP = "\t"
_ESCAPES = str.maketrans({"%": "%25", "\t": "%09", "\r": "%0D", "\n": "%0A"})

log = logging.getLogger(__name__)


def encode_part(value: str) -> str:
    return value.translate(_ESCAPES)


def decode_part(value: str) -> str:
    return unquote(value) if "%" in value else value


def encode_field(model: str, tier: str, name: str) -> str:
    return SEP.join((encode_part(model), encode_part(tier), name))


def decode_field(raw: str) -> tuple[str, str, str] | None:
    """(model, tier, field name), or None for a field that is not one of ours."""
    parts = raw.split(SEP)
    if len(parts) != 3 or parts[2] not in FIELDS:
        return None
    return decode_part(parts[0]), decode_part(parts[1]), parts[2]

ADD_LUA = """
if KEYS[3] and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', 3600) then
  return 0
end
redis.call('SADD', KEYS[2], ARGV[1])
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


@dataclass(slots=True)
class UsageRow:
    day: str  # YYYY-MM-DD
    tenant: str
    model: str
    tier: str
    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))


class UsageLedger(Protocol):
    async def add(
        self, *, day: str, tenant: str, model: str, tier: str, values: Mapping[str, int], once: str = ""
    ) -> None:
        """Add `values` to the row; with `once`, a retry of the same addition is applied only once."""
        ...

    async def read(self, *, days: Sequence[str], tenant: str | None) -> list[UsageRow]: ...


class MemoryLedger:
    def __init__(self, *, remember_once: int = 100_000) -> None:
        self._rows: dict[tuple[str, str, str, str], UsageRow] = {}
        self._once: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_once

    async def add(
        self, *, day: str, tenant: str, model: str, tier: str, values: Mapping[str, int], once: str = ""
    ) -> None:
        if once:
            if once in self._once:
                return
            self._once[once] = None
            if len(self._once) > self._remember:
                self._once.popitem(last=False)
        row = self._rows.setdefault((day, tenant, model, tier), UsageRow(day, tenant, model, tier))
        for name, amount in values.items():
            row.values[name] = row.values.get(name, 0) + amount

    async def read(self, *, days: Sequence[str], tenant: str | None) -> list[UsageRow]:
        wanted = set(days)
        return [
            UsageRow(r.day, r.tenant, r.model, r.tier, dict(r.values))
            for key, r in sorted(self._rows.items())
            if key[0] in wanted and (tenant is None or key[1] == tenant)
        ]


class RedisLedger:
    def __init__(self, client: Redis, *, prefix: str, retention_days: int, url: str = "redis") -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = retention_days * 86400
        self._url = url
        self._add: Any = client.register_script(ADD_LUA)

    def _row_key(self, day: str, tenant: str) -> str:
        return f"{self._prefix}usage:{{{day}}}:{tenant}"

    def _tenants_key(self, day: str) -> str:
        return f"{self._prefix}usage:{{{day}}}:tenants"

    async def add(
        self, *, day: str, tenant: str, model: str, tier: str, values: Mapping[str, int], once: str = ""
    ) -> None:
        args: list[str | int] = [tenant, self._ttl_s]
        for name, amount in values.items():
            if amount:
                args += [encode_field(model, tier, name), amount]
        keys = [self._row_key(day, tenant), self._tenants_key(day)]
        if once:  # a marker kept for an hour makes a retried addition idempotent
            keys.append(f"{self._prefix}usage:{{{day}}}:once:{once}")
        await guarded(self._add(keys=keys, args=args), url=self._url)

    async def read(self, *, days: Sequence[str], tenant: str | None) -> list[UsageRow]:
        pairs: list[tuple[str, str]] = []
        if tenant is None:
            pipe = self._client.pipeline(transaction=False)
            for day in days:
                pipe.smembers(self._tenants_key(day))
            members = await guarded(pipe.execute(), url=self._url)
            for day, names in zip(days, members, strict=True):
                pairs += [(day, n.decode() if isinstance(n, bytes) else str(n)) for n in sorted(names)]
        else:
            pairs = [(day, tenant) for day in days]
        pipe = self._client.pipeline(transaction=False)
        for day, t in pairs:
            pipe.hgetall(self._row_key(day, t))
        hashes = await guarded(pipe.execute(), url=self._url)
        rows: dict[tuple[str, str, str, str], UsageRow] = {}
        for (day, t), data in zip(pairs, hashes, strict=True):
            for raw_field, raw_value in data.items():
                fname = raw_field.decode("utf-8", "replace") if isinstance(raw_field, bytes) else str(raw_field)
                parsed = decode_field(fname)
                try:
                    amount = int(raw_value)
                except ValueError:
                    parsed = None
                if parsed is None:
                    log.warning("usage ledger: skipping a malformed field", extra={"day": day, "tenant": t,
                                                                                   "field": fname[:200]})
                    continue
                model, tier, name = parsed
                row = rows.setdefault((day, t, model, tier), UsageRow(day, t, model, tier))
                row.values[name] = amount
        return [rows[k] for k in sorted(rows)]
