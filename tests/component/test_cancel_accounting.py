"""A client that leaves mid-stream is charged exactly the tokens the engine counted.

The engine here works in vLLM's order: a step's token is counted when the step ends and its chunk is
written a moment later (vLLM's API server serialises after its output processor counted); a client that
leaves aborts the request at once, and what was counted but not written is never sent. The client leaves
while such a token is pending. Hanging up at once (`cancel_drain_s: 0`) charges one token less than the
engine counted; the shipped drain (read to the next chunk, half-close, read to the engine's close) charges
exactly what it counted. The same for `/v1/messages` and `/v1/responses` (named events, `event_relay`): a
stream that never reaches its final usage is charged the output events that reached the gateway. With
`cancel_finish_tokens` covering what is left of the answer, the engine is not aborted: it finishes, and the
charge is its count. A stream the gateway ends at its deadline is drained like a client's cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
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
    def __init__(self, *, stall_after: int | None = None, extra: int = 0) -> None:
        self.counted = 0
        self.aborted = 0
        self.finished = 0
        self.url = ""
        self.stall_after = stall_after  # after this many tokens, go silent for a minute (a stalled engine)
        self.extra = extra  # tokens generated past max_tokens (an engine that ignores it)
        self._runner: web.AppRunner | None = None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        generated = 0
        try:
            while generated < int(body["max_tokens"]) + self.extra:
                if generated == self.stall_after:
                    await asyncio.sleep(60)
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

    async def _events(self, request: web.Request, *, limit: int, head: list[tuple[str, dict[str, Any]]],
                      delta: Callable[[int], tuple[str, dict[str, Any]]],
                      tail: Callable[[int], list[tuple[str, dict[str, Any]]]]) -> web.StreamResponse:
        """A named-event stream (vLLM's `/v1/messages`, `/v1/responses`) in the same order as `chat`: a token is
        counted, its delta event written later; usage only in `tail`, as vLLM sends it."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(events: list[tuple[str, dict[str, Any]]]) -> None:
            await resp.write(b"".join(f"event: {name}\ndata: ".encode() + orjson.dumps({"type": name, **data})
                                      + b"\n\n" for name, data in events))

        generated = 0
        try:
            await send(head)
            while generated < limit + self.extra:
                if generated == self.stall_after:
                    await asyncio.sleep(60)
                await asyncio.sleep(STEP_S - WRITE_LAG_S)
                generated += 1
                self.counted += 1
                await asyncio.sleep(WRITE_LAG_S)
                await send([delta(generated)])
            await send(tail(generated))
            self.finished += 1
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            raise
        return resp

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await self._events(
            request, limit=int(body["max_tokens"]),
            head=[("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m1",
                                                 "content": [], "stop_reason": None,
                                                 "usage": {"input_tokens": 3, "output_tokens": 0}}}),
                  ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})],
            delta=lambda k: ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"t{k} "}}),
            tail=lambda n: [("content_block_stop", {"index": 0}),
                            ("message_delta", {"delta": {"stop_reason": "max_tokens"},
                                               "usage": {"input_tokens": 3, "output_tokens": n}}),
                            ("message_stop", {})])

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = {"id": "resp_1", "object": "response", "model": "m1", "status": "in_progress", "output": [],
                    "usage": None}
        at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}

        def done(n: int) -> list[tuple[str, dict[str, Any]]]:
            usage = {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n,
                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 3 + n}
            return [("response.completed", {"sequence_number": n + 2, "response": {
                **response, "status": "incomplete", "usage": usage, "output": [{
                    "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "".join(f"t{k} " for k in range(1, n + 1))}]}]}})]

        return await self._events(
            request, limit=int(body["max_output_tokens"]),
            head=[("response.created", {"sequence_number": 0, "response": response}),
                  ("response.in_progress", {"sequence_number": 1, "response": response})],
            delta=lambda k: ("response.output_text.delta", {"sequence_number": k + 1, **at, "delta": f"t{k} "}),
            tail=done)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"vllm:generation_tokens_total {self.counted}\n")

    async def start(self) -> CountingEngine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
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


def request_body(path: str, *, max_tokens: int) -> dict[str, Any]:
    """A streamed request for `path`'s API, its output limited to `max_tokens`."""
    if path == "/v1/responses":
        return {"model": "m1", "input": "a b c", "max_output_tokens": max_tokens, "stream": True}
    return {"model": "m1", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": max_tokens,
            "stream": True}


async def leave_while_a_counted_token_is_pending(gateway_url: str, path: str, *, max_tokens: int = 50) -> int:
    """Read 3 tokens, wait until the 4th is counted but not yet written, leave; returns tokens received."""
    got = 0
    async with httpx.AsyncClient(base_url=gateway_url) as client, \
            client.stream("POST", path, json=request_body(path, max_tokens=max_tokens)) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and ('"delta": {"content"' in line.replace('":{', '": {')
                                               or '"text_delta"' in line or '"response.output_text.delta"' in line):
                got += 1
                if got == 3:
                    # Still connected (leaving the loop would close the stream now): the 4th token is counted
                    # STEP_S - WRITE_LAG_S after the 3rd was written, and written WRITE_LAG_S after that.
                    await asyncio.sleep(STEP_S - WRITE_LAG_S + WRITE_LAG_S / 2)
                    break
    return got


async def charged_after_leaving(engine: CountingEngine, start_gateway: Any, *, drain_s: float,
                                path: str = "/v1/chat/completions") -> tuple[int, int]:
    ledger = Ledger()
    gw = await start_gateway(settings_for({"m1": [engine.url]}, cancel_drain_s=drain_s), accountant=ledger)
    assert await leave_while_a_counted_token_is_pending(gw.url, path) == 3
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


EVENT_APIS = ["/v1/messages", "/v1/responses"]
APIS = ["/v1/chat/completions", *EVENT_APIS]


@pytest.mark.parametrize("path", EVENT_APIS)
@pytest.mark.parametrize(("drain_s", "lost"), [(2.0, 0), (0.0, 1)])
async def test_a_messages_or_responses_stream_left_mid_answer_is_drained_like_chat(
    counting_engine: CountingEngine, start_gateway: Any, drain_s: float, lost: int, path: str
) -> None:
    charged, counted = await charged_after_leaving(counting_engine, start_gateway, drain_s=drain_s, path=path)
    assert counted >= 4 and charged == counted - lost


@pytest.mark.parametrize("path", APIS)
@pytest.mark.parametrize(("finish_tokens", "finished"), [(8, True), (4, False)])
async def test_a_client_leaving_near_the_end_lets_the_engine_finish_and_is_charged_its_count(
    counting_engine: CountingEngine, start_gateway: Any, finish_tokens: int, finished: bool, path: str
) -> None:
    """8 tokens reserved, the client leaves after 3 (5 to come): within `cancel_finish_tokens` 8 the engine is
    not aborted and all 8 are charged; with 4 it is aborted (the drain) and charged what it counted. The
    Messages and Responses APIs alike, though their streams say how many tokens were generated only at the end
    (what is to come is estimated from the deltas; the charge is still the engine's final usage)."""
    ledger = Ledger()
    gw = await start_gateway(settings_for({"m1": [counting_engine.url]}, cancel_drain_s=2.0,
                                          cancel_finish_tokens=finish_tokens), accountant=ledger)
    assert await leave_while_a_counted_token_is_pending(gw.url, path, max_tokens=8) == 3
    engine = counting_engine
    assert await eventually(lambda: engine.aborted + engine.finished == 1, timeout_s=5)
    assert await eventually(lambda: bool(ledger.records))
    [record] = ledger.records
    assert record.status == 499
    assert (engine.finished, engine.aborted) == ((1, 0) if finished else (0, 1))
    assert record.usage.completion_tokens == engine.counted
    assert engine.counted == 8 if finished else engine.counted < 8


@pytest.mark.parametrize(("fault", "path"), [*(("stalls", path) for path in APIS),
                                             ("ignores max_tokens", "/v1/chat/completions")])
async def test_an_engine_finishing_for_a_departed_client_is_dropped_when_it_stalls_or_overruns(
    start_gateway: Any, fault: str, path: str
) -> None:
    """Finishing an answer nobody reads must not outlive a bad engine: one that goes silent is dropped after the
    inter-chunk timeout (not the 30-minute stream deadline), one that streams past max_tokens at the reservation;
    either way the tenant is charged what arrived, never more than the 8 tokens reserved. (An event stream's
    overrun is cut off at 2 * 8 + 16 deltas, `api_events`: 6.6 s at this engine's pace, too slow to wait for.)"""
    engine = await (CountingEngine(stall_after=5) if fault == "stalls" else CountingEngine(extra=40)).start()
    try:
        ledger = Ledger()
        gw = await start_gateway(settings_for({"m1": [engine.url]}, cancel_drain_s=2.0, cancel_finish_tokens=8,
                                              inter_chunk_timeout_s=1.0), accountant=ledger)
        started = asyncio.get_running_loop().time()
        assert await leave_while_a_counted_token_is_pending(gw.url, path, max_tokens=8) == 3
        assert await eventually(lambda: bool(ledger.records), timeout_s=6)
        assert asyncio.get_running_loop().time() - started < 6  # dropped, not waited out
        assert await eventually(lambda: engine.aborted == 1, timeout_s=3)  # the engine saw the gateway hang up
        [record] = ledger.records
        assert record.status == 499 and engine.finished == 0
        if fault == "stalls":
            assert record.usage.completion_tokens == engine.counted == 5
        else:
            assert record.usage.completion_tokens == 8 and engine.counted > 8
    finally:
        await engine.stop()


DEADLINE_EVENT = {"/v1/chat/completions": '"code":"stream_deadline"', "/v1/responses": '"code":"stream_deadline"',
                  "/v1/messages": '"type":"timeout_error"'}  # each API's own error event


@pytest.mark.parametrize("path", APIS)
@pytest.mark.parametrize(("drain_s", "lost"), [(2.0, 0), (0.0, 1)])
async def test_a_stream_ended_at_its_deadline_is_charged_what_the_engine_counted(
    counting_engine: CountingEngine, start_gateway: Any, drain_s: float, lost: int, path: str
) -> None:
    """The gateway's own stream deadline ends the stream while the engine's 3rd token is counted but not yet written
    (tokens counted at 0.05 + 0.2k s, written at 0.2k s; the deadline at 0.5 s). Hanging up there loses that
    token; the drain (as for a client that leaves) reads it, half-closes and charges exactly the engine's count."""
    ledger = Ledger()
    gw = await start_gateway(settings_for({"m1": [counting_engine.url]}, cancel_drain_s=drain_s,
                                          stream_deadline_s=0.5), accountant=ledger)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post(path, json=request_body(path, max_tokens=50))
    assert DEADLINE_EVENT[path] in r.text.replace(" ", "")
    assert await eventually(lambda: counting_engine.aborted == 1, timeout_s=5)
    await gw.pipeline.drain()
    assert await eventually(lambda: bool(ledger.records))
    [record] = ledger.records
    assert counting_engine.finished == 0 and counting_engine.counted >= 3
    assert record.usage.completion_tokens == counting_engine.counted - lost
