"""Redis plumbing shared by the tenancy backends: one client per app and failure mapping."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from fleetgate.core.kvstore import StoreUnavailableError

if TYPE_CHECKING:
    from redis.asyncio import Redis

T = TypeVar("T")


async def guarded(awaitable: Awaitable[T], *, url: str) -> T:
    """Turn connection-level Redis failures into `StoreUnavailableError` (the caller's fail-open policy)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        return await awaitable
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise StoreUnavailableError(f"redis at {url} unavailable: {exc}") from exc


def redis_client(url: str, *, timeout_s: float = 2.0, max_connections: int = 64) -> Redis:
    """A client with a bounded, blocking pool: a burst of concurrent requests queues for a connection
    instead of opening one socket per request. Connect and command timeouts are `timeout_s`; the wait
    for a free connection may be longer (5x), since under a burst it measures queueing, not an outage."""
    from redis.asyncio import BlockingConnectionPool, Redis

    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=5 * timeout_s,
        socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
    )
    return Redis(connection_pool=pool)
