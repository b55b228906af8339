"""The `KVStore` protocol: the one seam through which shared state is stored.

Two backends implement it: `MemoryKVStore` (one process, the embedded default) and
`RedisKVStore` (shared by every gateway replica). Both pass the same contract suite in
`tests/contract/test_kvstore_contract.py`.

Besides plain keys with TTLs the protocol has an append-only log (Redis Streams underneath):
readers that keep a process-local index (faiss, a prefix index) replay it to stay in sync
with writes made by other replicas.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from redis.asyncio import Redis


class StoreUnavailableError(Exception):
    """The backing store cannot be reached. Callers fail open on it."""


@runtime_checkable
class KVStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def set(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int: ...

    async def keys(self, pattern: str) -> list[str]: ...

    async def log_append(self, log: str, value: bytes, *, max_len: int | None = None) -> str: ...

    async def log_read(self, log: str, *, after: str = "0", count: int = 1000) -> list[tuple[str, bytes]]: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class MemoryKVStore:
    """In-process store. Expired keys are dropped lazily on access."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float | None]] = {}
        self._logs: dict[str, OrderedDict[str, bytes]] = {}
        self._seq = 0
        self._lock = asyncio.Lock()

    def _live(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        value, expires = item
        if expires is not None and expires <= time.monotonic():
            del self._data[key]
            return None
        return value

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._live(k) for k in keys]

    async def set(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        expires = time.monotonic() + ttl_s if ttl_s is not None else None
        self._data[key] = (value, expires)

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        async with self._lock:
            current = self._live(key)
            value = int(current or b"0") + amount
            expires = self._data[key][1] if current is not None else None
            if expires is None and ttl_s is not None:
                expires = time.monotonic() + ttl_s
            self._data[key] = (str(value).encode(), expires)
            return value

    async def keys(self, pattern: str) -> list[str]:
        return [k for k in list(self._data) if fnmatch.fnmatchcase(k, pattern) and self._live(k) is not None]

    async def log_append(self, log: str, value: bytes, *, max_len: int | None = None) -> str:
        self._seq += 1
        entry_id = f"{self._seq}-0"
        entries = self._logs.setdefault(log, OrderedDict())
        entries[entry_id] = value
        while max_len is not None and len(entries) > max_len:
            entries.popitem(last=False)
        return entry_id

    async def log_read(self, log: str, *, after: str = "0", count: int = 1000) -> list[tuple[str, bytes]]:
        after_seq = int(after.split("-")[0])
        out: list[tuple[str, bytes]] = []
        for entry_id, value in self._logs.get(log, {}).items():
            if int(entry_id.split("-")[0]) > after_seq:
                out.append((entry_id, value))
                if len(out) >= count:
                    break
        return out

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class RedisKVStore:
    """Redis-backed store (redis-py asyncio). Connection errors become `StoreUnavailableError`."""

    def __init__(self, url: str, *, prefix: str = "fg:", socket_timeout_s: float = 0.5) -> None:
        from redis.asyncio import Redis

        self.url = url
        self.prefix = prefix
        self.client: Redis = Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )

    def _k(self, key: str) -> str:
        return self.prefix + key

    async def _run(self, coro):  # type: ignore[no-untyped-def]
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailableError(f"redis at {self.url} unavailable: {exc}") from exc

    async def get(self, key: str) -> bytes | None:
        value: bytes | None = await self._run(self.client.get(self._k(key)))
        return value

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        values: list[bytes | None] = await self._run(self.client.mget([self._k(k) for k in keys]))
        return values

    async def set(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        px = int(ttl_s * 1000) if ttl_s is not None else None
        await self._run(self.client.set(self._k(key), value, px=px))

    async def delete(self, key: str) -> None:
        await self._run(self.client.delete(self._k(key)))

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        pipe = self.client.pipeline(transaction=True)
        pipe.incrby(self._k(key), amount)
        if ttl_s is not None:
            pipe.pexpire(self._k(key), int(ttl_s * 1000), nx=True)
        result = await self._run(pipe.execute())
        return int(result[0])

    async def keys(self, pattern: str) -> list[str]:
        found: list[str] = []
        cursor = 0
        while True:
            cursor, batch = await self._run(self.client.scan(cursor, match=self._k(pattern), count=1000))
            found.extend(k.decode()[len(self.prefix) :] for k in batch)
            if cursor == 0:
                return found

    async def log_append(self, log: str, value: bytes, *, max_len: int | None = None) -> str:
        entry_id = await self._run(
            self.client.xadd(self._k(log), {"v": value}, maxlen=max_len, approximate=max_len is not None)
        )
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def log_read(self, log: str, *, after: str = "0", count: int = 1000) -> list[tuple[str, bytes]]:
        rows = await self._run(self.client.xrange(self._k(log), min=f"({after}", count=count))
        return [(rid.decode(), fields[b"v"]) for rid, fields in rows]

    async def ping(self) -> bool:
        try:
            return bool(await self._run(self.client.ping()))
        except StoreUnavailableError:
            return False

    async def close(self) -> None:
        await self.client.aclose()


def make_kvstore(redis_url: str | None, *, prefix: str = "fg:") -> KVStore:
    """The embedded default is memory; a Redis URL makes the state shared across replicas."""
    if redis_url:
        return RedisKVStore(redis_url, prefix=prefix)
    return MemoryKVStore()
