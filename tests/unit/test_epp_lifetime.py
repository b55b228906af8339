"""A stream whose time is up, at each stage of the exchange (`Exchange.expire`), and the timer itself (`StreamLife`).

Through the real Envoy (`tests/e2e/test_epp_lifetime.py`): a relayed stream past its deadline, a non-streaming
request past its time limit before the engine answered, the drain. Here, fed messages directly: the phases a
proxy cannot be made to stop at on cue (before the body, between the pick and the response headers, while a
non-streaming answer is being assembled), each answered, settled and charged as the gateway would.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from fleetgate.gateway.epp.exchange import Exchange
from fleetgate.gateway.epp.lifetime import DEADLINE, StreamLife

from .test_epp_exchange import Ledger, body_msg, capped_epp, chat, headers_msg, response_headers_msg, runaway


def immediate(out: list[pb.ProcessingResponse]) -> tuple[int, dict[str, object]]:
    [only] = out
    answer = only.immediate_response
    return answer.status.code, orjson.loads(answer.body)


async def test_before_the_body_the_request_is_refused_and_nothing_is_counted() -> None:
    ledger = Ledger()
    epp = capped_epp(ledger)
    exchange = Exchange(epp.door)
    assert await exchange.on_message(headers_msg()) == []
    status, body = immediate(exchange.expire(DEADLINE))
    assert status == 504 and body["error"]["code"] == "request_deadline"  # type: ignore[index]
    assert exchange.done and exchange.expire(DEADLINE) == []  # once
    assert epp.pipeline.flow.metrics.in_flight._value.get() == 0


async def test_between_the_pick_and_the_response_the_endpoint_is_released() -> None:
    ledger = Ledger()
    epp = capped_epp(ledger)
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    await exchange.on_message(body_msg(chat()))
    state = epp.stages.scheduler.state  # type: ignore[attr-defined]
    assert sum(state.inflight.values()) == 1
    life = StreamLife(60)
    life.interrupt()  # the drain: before the stream's timer was entered, only the reason is kept
    status, body = immediate(exchange.expire(life.ending))
    assert status == 503 and "shutting down" in body["error"]["message"]  # type: ignore[index]
    assert state.inflight == {} and epp.pipeline.flow.metrics.in_flight._value.get() == 0
    exchange.close()  # the stream then closes: nothing more is settled
    await epp.pipeline.drain()
    [record] = ledger.records
    assert record.status == 503


async def test_an_answer_being_assembled_is_a_503_charged_what_the_engine_streamed() -> None:
    ledger = Ledger()
    epp = capped_epp(ledger)
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    await exchange.on_message(body_msg(chat(max_tokens=10)))  # not streaming: the picker assembles
    assert await exchange.on_message(response_headers_msg(content_type="text/event-stream")) == []
    partial = runaway(3, usage=True).removesuffix(b"data: [DONE]\n\n")  # 3 tokens so far, the engine still going
    assert await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(body=partial))) == []
    life = StreamLife(60)
    life.interrupt()
    status, _ = immediate(exchange.expire(life.ending))
    assert status == 503 and exchange.done
    await epp.pipeline.drain()
    [record] = ledger.records
    assert record.status == 503 and record.usage.completion_tokens == 3 and record.usage.prompt_tokens == 4
    assert epp.stages.scheduler.state.inflight == {}  # type: ignore[attr-defined]


async def test_the_timer_tightens_but_never_extends_and_the_drain_fires_it_now() -> None:
    life = StreamLife(30)
    with pytest.raises(TimeoutError):
        async with life:
            life.tighten(60)  # later than the deadline: ignored
            life.tighten(0.05)
            await asyncio.sleep(5)
    assert life.expired() and life.ending == DEADLINE
    life = StreamLife(30)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        async with life:
            asyncio.get_running_loop().call_later(0.05, life.interrupt, "bye")
            await asyncio.sleep(5)
    assert asyncio.get_running_loop().time() - started < 1
    assert life.ending.kind == "shutdown" and life.ending.message == "bye"
    assert life.ending.error().status == 503 and DEADLINE.error().status == 504
