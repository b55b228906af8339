"""Limit counters in Redis, checked and reserved atomically by Lua scripts (EVALSHA).

`reserve` runs one script over every window a request touches: it reads each counter (and, for sliding
minute windows, the previous minute's), refuses if any `load + amount > limit`, and otherwise adds the
amounts to all of them, in one step that no other gateway replica can interleave with. `adjust` adds the
settle deltas (real usage minus estimate) to counters that still exist; a counter that does not (it
expired while a long request ran, or a Redis restart lost it with the reservation) is set to the real
usage alone (`Move.absolute`), never to a negative value. Keys carry a `{tenant}` hash tag,
so one tenant's keys share a Redis Cluster slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleetgate.gateway.tenancy.limiter_circuit import Move
from fleetgate.gateway.tenancy.limiter_windows import Check
from fleetgate.gateway.tenancy.redis_client import guarded

if TYPE_CHECKING:
    from redis.asyncio import Redis

RESERVE_LUA = """
local now = tonumber(ARGV[1])
local n = #KEYS / 2
for i = 1, n do
  local b = 1 + (i - 1) * 6
  local limit = tonumber(ARGV[b + 1])
  local amount = tonumber(ARGV[b + 2])
  local cur = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
  local prev = 0
  local load = cur
  if ARGV[b + 6] == '1' then
    prev = tonumber(redis.call('GET', KEYS[2 * i]) or '0')
    local w = 1 - (now - tonumber(ARGV[b + 3])) / tonumber(ARGV[b + 4])
    if w < 0 then w = 0 end
    load = cur + prev * w
  end
  if load + amount > limit then
    return {i, cur, prev}
  end
end
for i = 1, n do
  local b = 1 + (i - 1) * 6
  redis.call('INCRBY', KEYS[2 * i - 1], ARGV[b + 2])
  redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[b + 5])
end
return {0, 0, 0}
"""

ADJUST_LUA = """
for i = 1, #KEYS do
  local delta = tonumber(ARGV[3 * i - 2])
  local ttl = tonumber(ARGV[3 * i - 1])
  local absolute = tonumber(ARGV[3 * i])
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], delta)
  elseif absolute > 0 and ttl > 0 then
    redis.call('SET', KEYS[i], absolute, 'PX', ttl)
  end
end
return 0
"""


class RedisCounters:
    """`CounterBackend` on Redis."""

    def __init__(self, client: Redis, *, url: str = "redis") -> None:
        self._client = client
        self._url = url
        self._reserve: Any = client.register_script(RESERVE_LUA)
        self._adjust: Any = client.register_script(ADJUST_LUA)

    async def reserve(self, checks: Sequence[Check], *, now_ms: int) -> tuple[int, int, int]:
        """(0, 0, 0) when reserved; else (1-based index of the refusing check, its cur, its prev)."""
        keys: list[str] = []
        args: list[int | str] = [now_ms]
        for c in checks:
            keys += [c.key, c.prev_key or c.key]
            args += [c.limit, c.amount, c.start_ms, c.window_ms, c.ttl_ms, "1" if c.sliding else "0"]
        result = await guarded(self._reserve(keys=keys, args=args), url=self._url)
        return int(result[0]), int(result[1]), int(result[2])

    async def adjust(self, moves: Sequence[Move]) -> None:
        items = [m for m in moves if m.delta or m.absolute]
        if not items:
            return
        args = [v for m in items for v in (m.delta, m.ttl_ms, m.absolute)]
        await guarded(self._adjust(keys=[m.key for m in items], args=args), url=self._url)

    async def read(self, keys: Sequence[str]) -> list[int]:
        if not keys:
            return []
        values = await guarded(self._client.mget(list(keys)), url=self._url)
        return [int(v or 0) for v in values]
