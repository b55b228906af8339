"""The null Endpoint Picker of the idle-path bench (`fleetgate.bench.null_picker`): its answers follow the picker's
protocol (the pick and the body once the request body is in, everything else passed through), and its marks name
each message on the first token's path and land in the trace keyed by the request."""

from __future__ import annotations

from pathlib import Path

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from fleetgate.bench.null_picker import SEQ, Marks, NullAnswers
from fleetgate.gateway.epp import messages


def _headers(seq: str | None) -> pb.ProcessingRequest:
    values = {":path": "/v1/completions", ":method": "POST", **({SEQ: seq} if seq else {})}
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()])))


def _body(data: bytes, *, end: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end))


def _chunk(data: bytes, *, end: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end))


RESPONSE_HEADERS = pb.ProcessingRequest(response_headers=pb.HttpHeaders())


def test_the_pick_and_the_whole_body_go_back_once_the_last_piece_is_in() -> None:
    null = NullAnswers("10.0.0.7:8000")
    assert null.answers(_headers("s1")) == []  # the headers are answered with the body, as the picker does
    assert null.answers(_body(b'{"prompt": ', end=False)) == []
    route, body = null.answers(_body(b'"hi"}', end=True))
    set_headers = route.request_headers.response.header_mutation.set_headers
    mutation = {h.header.key: h.header.raw_value.decode() for h in set_headers}
    assert mutation == {messages.DESTINATION: "10.0.0.7:8000", "content-length": str(len(b'{"prompt": "hi"}'))}
    streamed = body.request_body.response.body_mutation.streamed_response
    assert streamed.body == b'{"prompt": "hi"}' and streamed.end_of_stream


def test_the_response_passes_through_unchanged() -> None:
    null = NullAnswers("10.0.0.7:8000")
    [headers] = null.answers(RESPONSE_HEADERS)
    assert headers.HasField("response_headers") and not headers.response_headers.response.header_mutation.set_headers
    [first] = null.answers(_chunk(b"data: {}\n\n"))
    [last] = null.answers(_chunk(b"data: [DONE]\n\n", end=True))
    first_out = first.response_body.response.body_mutation.streamed_response
    last_out = last.response_body.response.body_mutation.streamed_response
    assert (first_out.body, first_out.end_of_stream) == (b"data: {}\n\n", False)
    assert (last_out.body, last_out.end_of_stream) == (b"data: [DONE]\n\n", True)


def test_marks_name_the_first_tokens_path_and_are_saved_under_the_request(tmp_path: Path) -> None:
    marks = Marks()
    names = [marks.name(m) for m in (_headers("door-3"), _body(b"{", end=False), _body(b"}", end=True),
                                     RESPONSE_HEADERS, _chunk(b"a"), _chunk(b"b", end=True))]
    assert names == ["req_headers", "req_body_piece", "req_body", "resp_headers", "chunk1", "chunk"]
    for name in names:
        marks.mark(name)
    first = marks.marks["chunk1"]
    marks.mark("chunk1")  # a name is stamped once: its first time
    assert marks.marks["chunk1"] == first
    trace = tmp_path / "trace"
    marks.save(trace)
    [line] = trace.read_bytes().splitlines()
    saved = orjson.loads(line)
    assert saved["seq"] == "door-3" and saved["open"] <= saved["req_headers"] <= saved["chunk1"]


def test_a_stream_without_the_bench_header_leaves_no_trace(tmp_path: Path) -> None:
    marks = Marks()
    marks.mark(marks.name(_headers(None)))  # the proxy's warm-up or a stray request: nothing to match it with
    marks.save(tmp_path / "trace")
    assert not (tmp_path / "trace").exists()
