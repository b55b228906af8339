"""The Endpoint Picker's exchange, fed ext_proc messages directly (the proxy's side played by the test).

What a plain Envoy cannot easily send is tested here: the protocol's `envoy.lb` served-endpoint metadata
naming a later endpoint of the list (a retry), subset hints in both shapes, a request without a body,
and a client that leaves between the pick and the response.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry

from fleetgate.gateway.epp import messages
from fleetgate.gateway.epp.exchange import Exchange
from fleetgate.gateway.epp.server import EppServer, build_epp
from fleetgate.gateway.settings import GatewaySettings

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


@pytest.fixture
def epp() -> EppServer:
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False},
        "models": [{"name": "m1", "endpoints": [f"http://{e}" for e in (A, B, C)]}],
        "epp": {"max_endpoints": 2},
    })
    return build_epp(settings, port=0, metrics_port=None, registry=CollectorRegistry())


def headers_msg(path: str = "/v1/chat/completions", *, method: str = "POST", end: bool = False,
                extra: dict[str, str] | None = None) -> pb.ProcessingRequest:
    values = {":path": path, ":method": method, "content-type": "application/json", **(extra or {})}
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]), end_of_stream=end))


def with_metadata(req: pb.ProcessingRequest, namespace: str, values: dict[str, Any]) -> pb.ProcessingRequest:
    found = struct_pb2.Struct()
    found.update(values)
    req.metadata_context.filter_metadata[namespace].CopyFrom(found)
    return req


def body_msg(body: dict[str, Any]) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=orjson.dumps(body), end_of_stream=True))


def response_headers_msg(status: int = 200, content_type: str = "application/json") -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":status", raw_value=str(status).encode()),
        base_pb2.HeaderValue(key="content-type", raw_value=content_type.encode())])))


def picked(out: list[pb.ProcessingResponse]) -> str:
    mutation = out[0].request_headers.response.header_mutation
    header = next(h.header.raw_value.decode() for h in mutation.set_headers
                  if h.header.key == messages.DESTINATION)
    assert out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields[messages.DESTINATION].string_value == header
    return header


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": content}], "max_tokens": 3, **extra}


async def route(epp: EppServer, body: dict[str, Any], *, hint: Any = None) -> tuple[Exchange, str]:
    exchange = Exchange(epp.door)
    assert await exchange.on_message(headers_msg()) == []
    req = body_msg(body)
    if hint is not None:
        with_metadata(req, messages.SUBSET_NAMESPACE, {messages.SUBSET: hint})
    out = await exchange.on_message(req)
    return exchange, picked(out)


async def test_the_list_is_ordered_and_the_served_endpoint_metadata_moves_the_in_flight_count(epp: EppServer) -> None:
    exchange, header = await route(epp, chat())
    first, second = header.split(",")  # the pick, then the scheduler's fallback (max_endpoints: 2)
    state = epp.stages.scheduler.state  # type: ignore[attr-defined]
    assert state.inflight == {first: 1}
    # the proxy could not reach the first and served from the second: it says so in envoy.lb metadata
    served = with_metadata(response_headers_msg(content_type="text/event-stream"), messages.LB_NAMESPACE,
                           {messages.SERVED: second})
    assert await exchange.on_message(served) == []  # a non-streaming answer: headers go out with the body
    assert state.inflight == {second: 1} and state.health.is_ejected(first)
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m1", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    sse = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
    out = await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(body=sse, end_of_stream=True)))
    mutation = out[0].response_headers.response.header_mutation
    sent = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert sent[messages.SERVED] == second and sent["content-type"] == "application/json" and exchange.done
    answer = orjson.loads(out[1].response_body.response.body_mutation.streamed_response.body)
    assert answer["choices"][0]["message"]["content"] == "hi" and answer["usage"]["completion_tokens"] == 1
    assert state.inflight == {}


@pytest.mark.parametrize("hint", [[B], B, f" {B} "])
async def test_a_subset_hint_in_either_shape_limits_the_pick(epp: EppServer, hint: Any) -> None:
    for i in range(3):
        _exchange, header = await route(epp, chat(f"question {i}"), hint=hint)
        assert header == B  # one endpoint allowed: no fallback outside the subset


async def test_a_subset_with_no_eligible_endpoint_is_503(epp: EppServer) -> None:
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    req = with_metadata(body_msg(chat()), messages.SUBSET_NAMESPACE, {messages.SUBSET: []})
    [out] = await exchange.on_message(req)
    assert out.immediate_response.status.code == 503 and exchange.done


async def test_a_completion_without_a_body_is_400_and_a_get_elsewhere_404(epp: EppServer) -> None:
    [out] = await Exchange(epp.door).on_message(headers_msg(end=True))
    assert out.immediate_response.status.code == 400
    assert orjson.loads(out.immediate_response.body)["error"]["type"] == "invalid_request_error"
    [out] = await Exchange(epp.door).on_message(headers_msg("/v1/embeddings", end=True))
    assert out.immediate_response.status.code == 404


async def test_a_client_leaving_after_the_pick_balances_the_counts(epp: EppServer) -> None:
    in_flight = epp.pipeline.flow.metrics.in_flight
    exchange, header = await route(epp, chat())
    state = epp.stages.scheduler.state  # type: ignore[attr-defined]
    assert state.inflight == {header.split(",")[0]: 1} and in_flight._value.get() == 1
    exchange.close()
    exchange.close()  # idempotent
    assert state.inflight == {} and in_flight._value.get() == 0
    await epp.pipeline.drain()
    assert epp.door.metrics.decision._sum.get() > 0  # the decision was timed
