"""Non-streaming answers read from an engine *stream*, and the usage a streamed engine call is charged.

The gateway streams non-streaming requests from the engine (`forwarding.assembled_upstream`), with usage on
every chunk, and assembles the answer (`assembly.StreamAssembler`): a client that leaves, or an engine that
breaks off or goes silent, still leaves the engine's usage so far, which is charged instead of $0.

`charged_usage`: the engine's last well-formed usage; when it is unknown (nothing reported, or a malformed
usage seen) the estimate of `engine_usage.fallback_usage`, and never less than it where both are known.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp

from fleetgate.core.types import Usage
from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.drain import Activity
from fleetgate.gateway.engine_usage import fallback_usage, parse_usage
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.settings import ServerSettings
from fleetgate.gateway.streaming import RelayStream, StreamOutcome


def capped(usage: Usage, completion_cap: int | None) -> Usage:
    """`usage` with no more completion tokens than were reserved (the client's `max_tokens` over all
    sequences): an engine that generates past them is not the tenant's cost."""
    if completion_cap is None or usage.completion_tokens <= completion_cap:
        return usage
    return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=completion_cap,
                 cached_tokens=usage.cached_tokens, estimated=usage.estimated)


def charged_usage(out: StreamOutcome, *, prompt_estimate: int, completion_cap: int | None = None) -> Usage:
    reported = parse_usage(out.usage)
    if reported is not None and not out.bad_usage:
        return capped(reported, completion_cap)
    estimate = fallback_usage(prompt_estimate=prompt_estimate, output_chunks=out.output_chunks)
    if reported is None:
        return capped(estimate, completion_cap)
    return capped(Usage(prompt_tokens=max(reported.prompt_tokens, estimate.prompt_tokens),
                        completion_tokens=max(reported.completion_tokens, estimate.completion_tokens),
                        cached_tokens=reported.cached_tokens, estimated=True), completion_cap)


async def collect_stream(
    response: aiohttp.ClientResponse, *, endpoint_id: str, kind: Kind, server: ServerSettings,
    on_done: Callable[[StreamOutcome], None], completion_cap: int | None = None, streams: Activity | None = None,
    on_first_token: Callable[[], None] | None = None,
) -> bool:
    """Read the engine's stream to its end (True: `server.request_timeout_s` ran out first). `on_done` gets
    the outcome exactly once, also when the caller is cancelled (the client left) or the stream broke.
    `streams`: where an open stream is registered, so a shutdown can end it; `on_first_token`: called once, at the
    first generated token."""
    relay = RelayStream(
        response=response, endpoint_id=endpoint_id, first_byte_timeout_s=server.first_byte_timeout_s,
        inter_chunk_timeout_s=server.inter_chunk_timeout_s, include_usage=False, continuous_usage=False,
        model_name=None, assembler=StreamAssembler(kind), on_done=on_done, collect_only=True,
        completion_cap=completion_cap, on_first_token=on_first_token,
    )
    if streams is not None:
        streams.opened(relay)
    try:
        return await read_to_end(relay, timeout_s=server.request_timeout_s)
    finally:
        if streams is not None:
            streams.closed(relay)


class Closable(Protocol):
    def __aiter__(self) -> AsyncIterator[bytes]: ...

    def close(self, *, cancelled: bool = False) -> None: ...


async def read_to_end(stream: Closable, *, timeout_s: float) -> bool:
    """Read a relayed stream to its end, for nobody (True: `timeout_s` ran out first). It is closed whatever
    happens (a cancelled caller: the client left), so its outcome is reported exactly once."""
    try:
        async with asyncio.timeout(timeout_s):
            async for _ in stream:
                pass
    except TimeoutError:
        return True
    finally:
        stream.close(cancelled=True)  # `cancelled` only counts when the stream had not ended
    return False


def answer_of(out: StreamOutcome, usage: Usage, *, model: str) -> dict[str, Any]:
    """The assembled response as the client gets it: the served model's name, and the charged usage
    where the engine's was missing or malformed."""
    obj = out.assembled
    assert obj is not None
    obj["model"] = model
    if out.bad_usage or out.usage is None:
        obj["usage"] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                        "total_tokens": usage.total_tokens}
    return obj
