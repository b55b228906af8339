"""A client that leaves mid-stream is charged exactly the tokens the engine counted.

The engine here works in vLLM's order: a step's token is counted when the step ends and its chunk is
written a moment later (vLLM's API server serialises after its output processor counted); a client that
leaves aborts the request at once, and what was counted but not written is never sent. The client leaves
while such a token is pending. Hanging up at once (`cancel_drain_s: 0`) charges one token less than the
engine counted; the shipped drain (read to the next chunk, half-close, read to the engine's close) charges
exactly what it counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from fleetgate.core.localredis import free_port
from fleetgate.gateway.stages import RequestRecord

from .conftest import eventually, settings_for

STEP_S = 0.2
WRITE_LAG_S = 0.15  # counted at the step's end, written this much later


class CountingEngine:
    def __init__(self) -> None:
        self.counted = 0
        self.aborted = 0
        self.finished = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        generated = 0
        try:
            while generated < int(body["max_tokens"]):
                await asyncio.sleep(STEP_S - WRITE_LAG_S)
                generated += 1
                self.counted += 1  # the step's output is counted ...
                await asyncio.sleep(WRITE_LAG_S)  # ... and its chunk written a moment later
                chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m1",
                         "choices": [{"index": 0, "delta": {"content": f"t{generated} "}, "finish_reason": None}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": generated, "total_tokens": 3 + generated}}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.finished += 1
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1  # the client left: nothing more is counted or sent
            raise
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"vllm:generation_tokens_total {self.counted}\n")

    async def start(self) -> CountingEngine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Ledger:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    async def record(self, record: RequestRecord) -> None:
        self.records.append(record)


@pytest.fixture
async def counting_engine() -> AsyncIterator[CountingEngine]:
    engine = await CountingEngine().start()
    yield engine
    await engine.stop()


async def leave_while_a_counted_token_is_pending(gateway_url: str) -> int:
    """Read 3 tokens, wait until the 4th is counted but not yet written, leave; returns tokens received."""
    got = 0
    body: dict[str, Any] = {"model": "m1", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 50,
                            "stream": True}
    async with httpx.AsyncClient(base_url=gateway_url) as client, client.stream(
        "POST", "/v1/chat/completions", json=body
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                got += 1
                if got == 3:
                    # Still connected (leaving the loop would close the stream now): the 4th token is counted
                    # STEP_S - WRITE_LAG_S after the 3rd was written, and written WRITE_LAG_S after that.
                    await asyncio.sleep(STEP_S - WRITE_LAG_S + WRITE_LAG_S / 2)
                    break
    return got


async def charged_after_leaving(engine: CountingEngine, start_gateway: Any, *, drain_s: float) -> tuple[int, int]:
    ledger = Ledger()
    gw = await start_gateway(settings_for({"m1": [engine.url]}, cancel_drain_s=drain_s), accountant=ledger)
    assert await leave_while_a_counted_token_is_pending(gw.url) == 3
    assert await eventually(lambda: engine.aborted == 1, timeout_s=5)
    await gw.pipeline.drain()
    assert await eventually(lambda: bool(ledger.records))
    [record] = ledger.records
    assert record.status == 499 and engine.finished == 0
    return record.usage.completion_tokens, engine.counted


async def test_leaving_mid_stream_is_charged_exactly_what_the_engine_counted(
    counting_engine: CountingEngine, start_gateway: Any
) -> None:
    charged, counted = await charged_after_leaving(counting_engine, start_gateway, drain_s=2.0)
    assert counted >= 4  # the pending token, and at most one more read while draining
    assert charged == counted


async def test_hanging_up_at_once_loses_the_token_counted_but_not_yet_written(
    counting_engine: CountingEngine, start_gateway: Any
) -> None:
    charged, counted = await charged_after_leaving(counting_engine, start_gateway, drain_s=0.0)
    assert counted == 4
    assert charged == 3
