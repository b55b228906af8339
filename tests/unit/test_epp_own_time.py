"""`fleetgate_epp_own_seconds`: the Endpoint Picker's own time per ext_proc exchange on a request it routes to an
engine, the exchange fed ext_proc messages directly (the proxy's side played by the test, as
`test_epp_exchange`). Each phase is observed once per routed request; a streaming client's first relayed chunk adds
`first_chunk` and the total; cache hits and refusals add nothing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from fleetgate.gateway.epp.exchange import Exchange
from fleetgate.gateway.epp.metrics import EPP_PHASES
from fleetgate.gateway.epp.server import EppServer, build_epp
from fleetgate.gateway.settings import GatewaySettings

from .test_epp_exchange import body_msg, chat, headers_msg, response_headers_msg

CHUNK = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m1", "choices": [
    {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
LAST = {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture
def epp() -> EppServer:
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False},
        "models": [{"name": "m1", "endpoints": ["http://10.0.0.1:8000"]}],
        "cache": {"enabled": True, "store_truncated": True, "semantic": {"enabled": False}},
    })
    return build_epp(settings, port=0, metrics_port=None, registry=CollectorRegistry())


def own(epp: EppServer) -> dict[str, tuple[float, float]]:
    """(count, sum in seconds) of each phase."""
    registry = epp._registry
    found = {}
    for phase in EPP_PHASES:
        count = registry.get_sample_value("fleetgate_epp_own_seconds_count", {"phase": phase})
        total = registry.get_sample_value("fleetgate_epp_own_seconds_sum", {"phase": phase})
        found[phase] = (count or 0.0, total or 0.0)
    return found


def counts(epp: EppServer) -> dict[str, float]:
    return {p: c for p, (c, _) in own(epp).items()}


def response_body(data: bytes, *, end: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end))


async def routed(epp: EppServer, body: dict[str, Any]) -> Exchange:
    exchange = Exchange(epp.door)
    assert await exchange.on_message(headers_msg()) == []
    out = await exchange.on_message(body_msg(body))
    assert out[0].HasField("request_headers"), out  # routed, not answered by the picker
    return exchange


async def answer_stream(exchange: Exchange) -> list[pb.ProcessingResponse]:
    """The engine's stream: its headers, half an event (nothing to relay yet), the rest, the end."""
    assert await exchange.on_message(response_headers_msg(content_type="text/event-stream"))
    event = b"data: " + orjson.dumps(CHUNK) + b"\n\n"
    assert await exchange.on_message(response_body(event[:10])) == []
    first = await exchange.on_message(response_body(event[10:]))
    assert first and b"hi" in first[0].response_body.response.body_mutation.streamed_response.body
    last = b"data: " + orjson.dumps(LAST) + b"\n\ndata: [DONE]\n\n"
    await exchange.on_message(response_body(last, end=True))
    assert exchange.done
    return first


async def test_a_streamed_request_counts_each_phase_once_and_the_total_is_their_sum(epp: EppServer) -> None:
    assert counts(epp) == {p: 0.0 for p in EPP_PHASES}
    for i in range(2):
        await answer_stream(await routed(epp, chat(f"question {i}", stream=True)))
    seen = own(epp)
    assert counts(epp) == {p: 2.0 for p in EPP_PHASES}
    headers, first, total = (seen[p][1] for p in EPP_PHASES)
    decision = epp.door.metrics.decision  # `fleetgate_epp_decision_seconds`: the same requests' decisions
    assert decision._sum.get() > 0 and headers > 0 and first > 0
    assert total == pytest.approx(headers + decision._sum.get() + first, abs=1e-6)


async def test_an_unstreamed_request_counts_the_request_phases_alone(epp: EppServer) -> None:
    exchange = await routed(epp, chat("whole", stream=False))
    assert await exchange.on_message(response_headers_msg(content_type="text/event-stream")) == []  # assembled
    await exchange.on_message(response_body(b"data: " + orjson.dumps(CHUNK) + b"\n\n"))
    await exchange.on_message(response_body(b"data: " + orjson.dumps(LAST) + b"\n\ndata: [DONE]\n\n", end=True))
    assert exchange.done
    assert counts(epp) == {"request_headers": 1.0, "first_chunk": 0.0, "total_to_first_byte": 0.0}


async def test_cache_hits_refusals_and_an_engines_refusal_add_no_first_chunk(epp: EppServer) -> None:
    await answer_stream(await routed(epp, chat("once", stream=True, temperature=0)))
    await epp.pipeline.drain()
    assert len(epp.stages.cache.index) == 1  # type: ignore[attr-defined]
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    [hit] = await exchange.on_message(body_msg(chat("once", stream=True, temperature=0)))
    assert hit.immediate_response.status.code == 200 and exchange.done  # answered by the picker
    for refused in ({**chat(), "model": "nope"}, {**chat(), "temperature": "hot"}):
        exchange = Exchange(epp.door)
        await exchange.on_message(headers_msg())
        [out] = await exchange.on_message(body_msg(refused))
        assert out.immediate_response.status.code in (400, 404)
    [unrouted] = await Exchange(epp.door).on_message(headers_msg("/v1/embeddings", end=True))
    assert unrouted.immediate_response.status.code == 404
    assert counts(epp) == {p: 1.0 for p in EPP_PHASES}  # the first request alone
    # routed, but the engine refused the stream: the request phases count, no chunk of an answer was relayed
    exchange = await routed(epp, chat("busy", stream=True))
    assert await exchange.on_message(response_headers_msg(503)) == []
    [out] = await exchange.on_message(response_body(b'{"error": {"message": "busy"}}', end=True))
    assert out.immediate_response.status.code == 503
    assert counts(epp) == {"request_headers": 2.0, "first_chunk": 1.0, "total_to_first_byte": 1.0}
