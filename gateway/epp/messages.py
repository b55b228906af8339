"""Envoy ext_proc messages for the Endpoint Picker protocol: read what the proxy sends, build what it gets back.

The only module of the EPP that touches the generated protobuf types (`xds-protos`); everything else works on
plain dicts and bytes. Names and places follow the Gateway API Inference Extension's protocol (v1.0.0):
- the pick goes back twice, with identical values: the request header `x-gateway-destination-endpoint`
  (`ip:port[,ip:port...]`, ordered: a retry walks the list) and `dynamic_metadata["envoy.lb"]` under the same key;
- the proxy may restrict the pick with `metadata_context["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]` (a list of `ip:port`);
- on the response path the proxy says which endpoint served in `metadata_context["envoy.lb"]
  ["x-gateway-destination-endpoint-served"]`.
Envoy's `response.flags` attribute (when the proxy sends it: `envoyconfig` asks for it) tells the proxy's own
connect failure (flag UF) from an engine's answer: both are a 503, only the first means the pod is unreachable.
Bodies go back as `streamed_response` mutations (the proxy runs both bodies in FULL_DUPLEX_STREAMED mode), in
pieces of at most `BODY_PIECE` bytes (some proxies cap one streamed chunk at 64 KiB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
BODY_PIECE = 62_000
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
RESPONSE_FLAGS = "response.flags"
UPSTREAM_CONNECTION_FAILURE = 0x20  # Envoy's response flag UF (`StreamInfo::CoreResponseFlag`): the bit is stable
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """The message's headers, names lower-cased (Envoy sends values in `raw_value`)."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return out


def metadata(req: pb.ProcessingRequest, namespace: str) -> dict[str, Any]:
    """One namespace of the request's `metadata_context.filter_metadata`, as plain values ({} when absent)."""
    found = req.metadata_context.filter_metadata.get(namespace)
    return json_format.MessageToDict(found) if found is not None else {}


def subset_hint(req: pb.ProcessingRequest) -> set[str] | None:
    """The endpoints the proxy allows (`ip:port`), or None when it sets no hint (any endpoint of the pool)."""
    hint = metadata(req, SUBSET_NAMESPACE).get(SUBSET)
    if hint is None:
        return None
    values = hint if isinstance(hint, list) else str(hint).split(",")
    return {str(v).strip() for v in values if str(v).strip()}


def served_endpoint(req: pb.ProcessingRequest) -> str | None:
    """The endpoint that served: the protocol's `envoy.lb` metadata, else Envoy's `upstream.address` attribute
    (what a plain Envoy can send: `envoyconfig`)."""
    value = metadata(req, LB_NAMESPACE).get(SERVED)
    if not value:
        address = _attribute(req, UPSTREAM_ADDRESS)
        value = address.string_value if address is not None else None
    return str(value) if value else None


def _attribute(req: pb.ProcessingRequest, name: str) -> struct_pb2.Value | None:
    attributes = req.attributes.get(EXT_PROC_FILTER)
    return attributes.fields[name] if attributes is not None and name in attributes.fields else None


def connect_failed(req: pb.ProcessingRequest) -> bool:
    """The proxy could not connect to the endpoint (Envoy's flag UF, `response.flags`): the response is the
    proxy's own, no engine was reached. False when the proxy does not send the attribute."""
    flags = _attribute(req, RESPONSE_FLAGS)
    return flags is not None and int(flags.number_value) & UPSTREAM_CONNECTION_FAILURE != 0


def _mutation(set_headers: Mapping[str, str], remove: tuple[str, ...] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1")),
                                       append_action=_OVERWRITE)
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(values)
    return out


def route_to(endpoints: list[str], *, set_headers: Mapping[str, str], remove: tuple[str, ...]) -> pb.ProcessingResponse:
    """The answer to the request headers: the ordered endpoints as the destination header and as `envoy.lb`
    dynamic metadata (identical values), the route recomputed for the new header."""
    picked = ",".join(endpoints)
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(
            clear_route_cache=True, header_mutation=_mutation({DESTINATION: picked, **set_headers}, remove))),
        dynamic_metadata=_struct({LB_NAMESPACE: {DESTINATION: picked}}),
    )


def body_piece(body: bytes, *, response: bool, end: bool) -> pb.ProcessingResponse:
    """One streamed body mutation (at most `BODY_PIECE` bytes). Built in place through the nested fields rather
    than from five constructed messages: this runs for every chunk of every stream (a third of the picker's own
    work per response chunk)."""
    out = pb.ProcessingResponse()
    streamed = (out.response_body if response else out.request_body).response.body_mutation.streamed_response
    streamed.SetInParent()  # present even when empty and not the end: the proxy requires a streamed_response
    if body:
        streamed.body = body
    if end:
        streamed.end_of_stream = True
    return out


def body_pieces(body: bytes, *, response: bool, end: bool = True) -> list[pb.ProcessingResponse]:
    """`body` as streamed body mutations of the request (`response=False`) or response body; the last piece
    carries `end_of_stream` when `end`. An empty body is one empty piece."""
    if len(body) <= BODY_PIECE:
        return [body_piece(body, response=response, end=end)]
    last = (len(body) - 1) // BODY_PIECE * BODY_PIECE
    return [body_piece(body[i:i + BODY_PIECE], response=response, end=end and i == last)
            for i in range(0, len(body), BODY_PIECE)]


def response_headers(*, set_headers: Mapping[str, str], remove: tuple[str, ...] = ()) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=_mutation(set_headers, remove))))


def trailers() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate(status: int, headers: Mapping[str, str], body: bytes, *, media_type: str) -> pb.ProcessingResponse:
    """Answer the client directly (a refusal, an error, a cache hit): the proxy sends no request upstream."""
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=_mutation({"content-type": media_type, **headers}),
        body=body,
    ))
