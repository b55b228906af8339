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
from fleetgate.gateway.stages import RequestRecord

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


async def test_a_retry_to_the_second_endpoint_keeps_the_requests_routing_cycle(epp: EppServer) -> None:
    """The proxy served from the list's second endpoint: it starts there with what the pick computed (its cached
    share of the prompt), as a first try would, not with an empty cycle that counts the whole prompt as prefill
    queued there."""
    scheduler = epp.stages.scheduler  # type: ignore[attr-defined]
    (prefill,) = [s for s, _ in scheduler.profile.scorers if s.name == "prefill"]
    prefix = " ".join(f"shared-{i}" for i in range(1200))  # ~11 KB: about 21 blocks of 512 characters
    for warm in (A, B):  # both hold the prefix: whichever comes second in the list is warm
        exchange, _ = await route(epp, chat(f"{prefix} warm {warm}"), hint=[warm])
        exchange.close()
    assert prefill.queued == {}
    exchange, header = await route(epp, chat(f"{prefix} the question"), hint=[A, B])
    first, second = header.split(",")
    queued_first = prefill.queued.get(first, 0.0)
    assert queued_first < 300  # at most the warm prompt's uncached tail, not its ~3,300 tokens
    served = with_metadata(response_headers_msg(content_type="text/event-stream"), messages.LB_NAMESPACE,
                           {messages.SERVED: second})
    await exchange.on_message(served)
    assert first not in prefill.queued and prefill.queued.get(second, 0.0) == pytest.approx(queued_first, abs=50)
    exchange.close()
    assert prefill.queued == {} and scheduler.state.inflight == {}


async def test_trailers_end_an_engines_error_answer_too(epp: EppServer) -> None:
    """The body came without end_of_stream and the trailers end it (an HTTP/2 hop): an engine's 503 is answered
    then, as the gateway answers it, and no trailers response follows the ImmediateResponse."""
    in_flight = epp.pipeline.flow.metrics.in_flight
    exchange, _ = await route(epp, chat(), hint=[C])
    assert await exchange.on_message(response_headers_msg(503)) == []
    assert await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(
        body=b'{"error": {"message": "busy"}}'))) == []
    [out] = await exchange.on_message(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    assert out.immediate_response.status.code == 503 and exchange.done
    assert epp.stages.scheduler.state.inflight == {} and in_flight._value.get() == 0  # type: ignore[attr-defined]
    exchange.close()  # the stream ends: nothing left to settle
    assert epp.stages.scheduler.state.inflight == {}  # type: ignore[attr-defined]


def flagged(req: pb.ProcessingRequest, *, flags: int, address: str) -> pb.ProcessingRequest:
    """Response headers with Envoy's attributes, as `envoyconfig` asks for them."""
    attributes = struct_pb2.Struct()
    attributes.update({messages.RESPONSE_FLAGS: flags, messages.UPSTREAM_ADDRESS: address})
    req.attributes[messages.EXT_PROC_FILTER].CopyFrom(attributes)
    return req


async def test_the_proxys_connect_failure_ejects_the_endpoint_once_and_an_engines_503_does_not(
        epp: EppServer) -> None:
    state = epp.stages.scheduler.state  # type: ignore[attr-defined]
    refused, _ = await route(epp, chat("first"), hint=[A])
    other, _ = await route(epp, chat("second"), hint=[A])  # still in flight on A throughout
    assert state.inflight == {A: 2}
    # an engine's own 503 (no UF flag): an answer, not a dead pod
    assert await refused.on_message(flagged(response_headers_msg(503), flags=0, address=A)) == []
    out = await refused.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(
        body=b'{"error": {"message": "busy"}}', end_of_stream=True)))
    assert out[0].immediate_response.status.code == 503 and not state.health.is_ejected(A)
    assert state.inflight == {A: 1}
    # Envoy could not connect (UF = 0x20, with another flag set beside it): ejected at the headers
    failed, _ = await route(epp, chat("third"), hint=[A])
    assert await failed.on_message(flagged(response_headers_msg(503), flags=0x20 | 0x4, address=A)) == []
    assert state.health.is_ejected(A) and state.inflight == {A: 1}
    failed.close()  # the client leaves before the proxy's body: the engine call is not ended twice
    assert state.inflight == {A: 1}
    other.close()
    assert state.inflight == {}


async def test_the_proxys_connect_failure_is_answered_with_the_gateways_503(epp: EppServer) -> None:
    exchange, _ = await route(epp, chat(), hint=[B])
    await exchange.on_message(flagged(response_headers_msg(503), flags=0x20, address=B))
    out = await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(
        body=b"upstream connect error or disconnect/reset before headers", end_of_stream=True)))
    # a mutation of the proxy's reply, not an ImmediateResponse (Envoy would map that local reply again)
    sent = {h.header.key: h.header.raw_value.decode()
            for h in out[0].response_headers.response.header_mutation.set_headers}
    body = out[1].response_body.response.body_mutation.streamed_response
    error = orjson.loads(body.body)["error"]
    assert error["code"] == "upstream_unavailable" and "cannot connect" in error["message"] and body.end_of_stream
    assert sent["content-length"] == str(len(body.body)) and "retry-after" in {k.lower() for k in sent}
    assert messages.SERVED not in sent and exchange.done  # nothing served it


class Ledger:
    """Every request record the picker writes (the accountant stage)."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    async def record(self, record: RequestRecord) -> None:
        self.records.append(record)


def capped_epp(ledger: Ledger) -> EppServer:
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False},
        "models": [{"name": "m1", "endpoints": [f"http://{A}"],
                    "adapters": [{"name": "theirs", "source": "/adapters/theirs", "tenants": ["someone-else"]}]}],
    })
    return build_epp(settings, port=0, metrics_port=None, registry=CollectorRegistry(), accountant=ledger)


def runaway(n: int, *, usage: bool) -> bytes:
    """An engine that ignores max_tokens: `n` one-token chunks (with the usage so far, or none), then [DONE]."""
    events = []
    for i in range(n):
        chunk: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m1",
                                 "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
        if usage:
            chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": i + 1, "total_tokens": i + 5}
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def sent_upstream(out: list[pb.ProcessingResponse]) -> dict[str, Any]:
    return orjson.loads(b"".join(o.request_body.response.body_mutation.streamed_response.body for o in out[1:]))


@pytest.mark.parametrize("usage", [True, False])
async def test_the_picker_cuts_a_runaway_stream_at_the_reserved_cap_and_charges_no_more(usage: bool) -> None:
    """Issue 26's completion cap through the shared flow: the picker relays and charges as the gateway does."""
    ledger = Ledger()
    epp = capped_epp(ledger)
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    out = await exchange.on_message(body_msg(chat(stream=True)))  # max_tokens: 3
    assert sent_upstream(out)["stream_options"]["include_usage"] is True
    await exchange.on_message(response_headers_msg(content_type="text/event-stream"))
    body = runaway(12, usage=usage)
    relayed = b""
    for piece in (body[: len(body) // 2], body[len(body) // 2 :]):  # the proxy's chunks split anywhere
        end = piece is not body[: len(body) // 2]
        msgs = await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(body=piece,
                                                                                        end_of_stream=end)))
        relayed += b"".join(m.response_body.response.body_mutation.streamed_response.body for m in msgs)
    events = [e[6:] for e in relayed.decode().split("\n\n") if e.startswith("data: ")]
    content = [orjson.loads(e) for e in events if e != "[DONE]" and "choices" in orjson.loads(e)]
    assert len(content) == 3 and events[-1] == "[DONE]"
    assert orjson.loads(events[-2])["error"]["code"] == "max_tokens_exceeded"
    assert exchange.done
    await epp.pipeline.drain()
    [record] = ledger.records
    assert record.usage.completion_tokens == 3 and record.status == 502  # the engine's fault, charged the cap


async def test_a_plain_answer_past_the_cap_is_charged_the_cap() -> None:
    ledger = Ledger()
    epp = capped_epp(ledger)
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    await exchange.on_message(body_msg(chat(logprobs=True)))  # not assembled: the engine's JSON as it is
    await exchange.on_message(response_headers_msg())
    answer = {"id": "x", "object": "chat.completion", "created": 1, "model": "m1", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "far too long"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 500, "total_tokens": 504}}
    await exchange.on_message(pb.ProcessingRequest(response_body=pb.HttpBody(body=orjson.dumps(answer),
                                                                             end_of_stream=True)))
    await epp.pipeline.drain()
    [record] = ledger.records
    assert record.status == 200 and record.usage.completion_tokens == 3 and record.usage.prompt_tokens == 4


async def test_another_tenants_private_adapter_is_an_unknown_model_to_the_picker() -> None:
    epp = capped_epp(Ledger())
    answers = []
    for model in ("theirs", "no-such-model"):
        exchange = Exchange(epp.door)
        await exchange.on_message(headers_msg())
        [out] = await exchange.on_message(body_msg({**chat(), "model": model}))
        error = orjson.loads(out.immediate_response.body)["error"]
        answers.append((out.immediate_response.status.code, error["message"].replace(model, "NAME")))
    assert answers[0] == answers[1] and answers[0][0] == 404 and "theirs" not in answers[0][1]


async def test_the_picker_refuses_an_embedding_model_on_chat_before_picking() -> None:
    """The shared flow's accept hook: an encoder (task: embed) asked for a chat completion is a 400 naming the
    model, nothing is reserved or picked; a chat model on the same pool is still picked."""
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False},
        "models": [{"name": "m1", "endpoints": [f"http://{A}"]},
                   {"name": "all-minilm-l6-v2", "endpoints": [f"http://{B}"], "task": "embed"}],
    })
    epp = build_epp(settings, port=0, metrics_port=None, registry=CollectorRegistry())
    exchange = Exchange(epp.door)
    await exchange.on_message(headers_msg())
    [out] = await exchange.on_message(body_msg({**chat(), "model": "all-minilm-l6-v2"}))
    assert out.immediate_response.status.code == 400 and exchange.done
    error = orjson.loads(out.immediate_response.body)["error"]
    assert error["param"] == "model" and "embedding model" in error["message"]
    assert epp.stages.scheduler.state.inflight == {}  # type: ignore[attr-defined]
    _exchange, header = await route(epp, chat())
    assert header == A
    await epp.pipeline.drain()
