"""One HTTP request as the proxy streams it to the Endpoint Picker: ext_proc messages in, answers out.

The proxy runs the request and response bodies in FULL_DUPLEX_STREAMED mode: it sends the request headers,
then body chunks, without waiting; the picker answers the headers only once it has the whole body, because
every decision needs it. Per request, in the order the protocol requires (headers, then body, per direction):

1. request headers: a completion route's API key is checked at once (401 before the body is read, as the
   gateway's fast path does); `/v1/models` is answered directly; any other route is a 404.
2. request body (to its end): the shared `flow.Flow` admits it (parse, authorize, limits and budgets, cache,
   tier); a refusal or a cache hit is an ImmediateResponse, so the request never reaches an engine. Otherwise
   the forwarder chooses the endpoints (`Forwarder.choose`, honouring the proxy's subset hint) and the answer
   to the headers routes the request there (`x-gateway-destination-endpoint` and `envoy.lb` metadata, the
   same ordered list); the body goes back rewritten as the gateway would send it (served model name, the
   reservation's max_tokens, usage on every chunk: `forwarding.upstream_body`). The client's API key is
   removed: engines never see tenants' keys.
3. response headers and body: `answer.Answer` (when the proxy could not connect to the endpoint, its own
   503 flagged UF: the endpoint is ejected, as the gateway ejects one it cannot connect to). The response ends
   with the body's end_of_stream, or with trailers when the engine sent some (an HTTP/2 hop passes them on).
Anything that ends the stream early (the client left, the proxy reset it) is `close()`: the engine's work so
far is charged and the request recorded as 499. Upstream timeouts are the proxy's (its route timeouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter_ns

import orjson

from fleetgate.core.errors import FleetGateError, NotFoundError, PayloadTooLargeError
from fleetgate.core.types import Usage
from fleetgate.gateway.context import GatewayResponse, RequestContext
from fleetgate.gateway.drain import Activity
from fleetgate.gateway.epp import messages
from fleetgate.gateway.epp.answer import Answer
from fleetgate.gateway.epp.lifetime import Ending, StreamLife
from fleetgate.gateway.epp.metrics import EppMetrics
from fleetgate.gateway.flow import Admitted
from fleetgate.gateway.forwarding import Choice, address_of, assembled_upstream, upstream_body
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.replay import replay_chunks
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import Tenant

ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
REMOVED_UPSTREAM = ("authorization",)  # a tenant's FleetGate key is not the engine's business


@dataclass(slots=True)
class Door:
    """What every exchange of one Endpoint Picker shares."""

    pipeline: Pipeline
    settings: GatewaySettings
    metrics: EppMetrics
    activity: Activity = field(default_factory=Activity)  # open streams: what the drain waits for, then ends


class Exchange:
    def __init__(self, door: Door, life: StreamLife | None = None) -> None:
        self._door = door
        self._life = life
        self._flow = door.pipeline.flow
        self._headers: dict[str, str] = {}
        self._kind: Kind | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._ctx: RequestContext | None = None
        self._choice: Choice | None = None
        self._answer: Answer | None = None
        self._tenant: Tenant | None = None
        self._assembled = False  # a non-streaming request streamed from the engine and assembled here
        self._counted = False  # in the in-flight gauge
        self._headers_ns = 0  # the picker's time on the request headers (`metrics.EppOwnTime`)
        self._before_ns = 0  # the request phases' sum once routed, until the first chunk is relayed (0: not timed)
        self.done = False  # an immediate response was sent, or the answer is complete

    async def on_message(self, req: messages.ProcessingRequest) -> list[messages.ProcessingResponse]:
        kind = req.WhichOneof("request")
        if kind == "response_body":  # first: every chunk of every answer comes this way
            body = req.response_body
            answer = self._answer
            if answer is None:  # a body without headers: protocol misuse; pass it through untouched
                return messages.body_pieces(body.body, response=True, end=body.end_of_stream)
            if self._before_ns:  # a streaming client's first chunk is not relayed yet: time this exchange
                read_ns = perf_counter_ns()
                out = answer.body(body.body, end=body.end_of_stream)
                if out:
                    self._door.metrics.own.first_chunk(perf_counter_ns() - read_ns, self._before_ns)
                    self._before_ns = 0
            else:
                out = answer.body(body.body, end=body.end_of_stream)
            if answer.done:
                self._settled_if(True)
            return out
        if kind == "request_headers":
            return await self._request_headers(req)
        if kind == "request_body":
            return await self._request_body(req)
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "response_trailers":
            return self._response_trailers()
        return []  # request trailers: HTTP/1.1 clients send none; nothing to answer in FULL_DUPLEX mode

    # ---- request ------------------------------------------------------------------------------

    async def _request_headers(self, req: messages.ProcessingRequest) -> list[messages.ProcessingResponse]:
        started = perf_counter_ns()
        self._headers = headers = messages.header_map(req.request_headers)
        path = headers.get(":path", "").split("?", 1)[0]
        method = headers.get(":method", "")
        self._kind = ROUTES.get(path) if method == "POST" else None
        if self._kind is None:
            if method == "GET" and path == "/v1/models":
                return self._immediate(await self._flow.list_models(headers=headers))
            exc = NotFoundError(f"no route {method} {path[:200]}; the inference routes are "
                                "POST /v1/chat/completions, POST /v1/completions and GET /v1/models",
                                code="unknown_route")
            return self._immediate(self._flow.error(self._flow.new_context(headers), exc))
        declared = headers.get("content-length", "")
        limit = self._door.settings.server.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            exc2 = PayloadTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
            return self._immediate(self._flow.error(self._flow.new_context(headers), exc2))
        try:
            self._tenant = await self._flow.authenticate(headers=headers)
        except FleetGateError as exc3:  # before the body is read, as the gateway's fast path refuses it
            return self._immediate(self._flow.error(self._flow.new_context(headers), exc3))
        self._headers_ns = perf_counter_ns() - started
        if req.request_headers.end_of_stream:
            return await self._admit(req)
        return []

    async def _request_body(self, req: messages.ProcessingRequest) -> list[messages.ProcessingResponse]:
        if self.done or self._kind is None:
            return []
        chunk = req.request_body.body
        self._size += len(chunk)
        limit = self._door.settings.server.max_body_bytes
        if self._size > limit:
            exc = PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
            return self._immediate(self._flow.error(self._flow.new_context(self._headers), exc))
        self._body.append(chunk)
        if not req.request_body.end_of_stream:
            return []
        return await self._admit(req)

    async def _admit(self, req: messages.ProcessingRequest) -> list[messages.ProcessingResponse]:
        flow, door = self._flow, self._door
        assert self._kind is not None
        started = perf_counter_ns()
        ctx = self._ctx = flow.new_context(self._headers)
        raw = b"".join(self._body)
        self._body = []
        flow.metrics.in_flight.inc()
        self._counted = True
        try:
            admitted = await flow.admit(ctx, kind=self._kind, raw=raw, headers=self._headers, tenant=self._tenant)
            if admitted.hit is not None:
                return self._serve_hit(ctx, admitted)
            self._choice = choice = await door.pipeline.forwarder.choose(ctx, admitted.targets,
                                                                         allowed=messages.subset_hint(req))
        except FleetGateError as exc:
            return self._immediate(flow.error(ctx, exc))
        attempt = choice.attempt
        ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
        parsed = admitted.parsed
        if not parsed.stream and self._life is not None:  # the gateway's bound on a whole non-streaming call
            self._life.tighten(door.settings.server.request_timeout_s)
        self._assembled = (door.settings.epp.assemble_non_streaming and not parsed.stream
                           and assembled_upstream(parsed.body))
        cap = ctx.reservation.max_tokens if ctx.reservation is not None and parsed.max_tokens is None else None
        body = upstream_body(parsed.body, served_name=choice.served_name or attempt.endpoint.model,
                             stream=parsed.stream or self._assembled, raw=parsed.raw, max_tokens=cap)
        listed = choice.endpoints[:door.settings.epp.max_endpoints]
        out = [messages.route_to([address_of(e) for e in listed],
                                 set_headers={"content-length": str(len(body)), "x-request-id": ctx.request_id},
                                 remove=REMOVED_UPSTREAM),
               *messages.body_pieces(body, response=False)]
        took = perf_counter_ns() - started
        door.metrics.decision.observe(took / 1e9)
        before = door.metrics.own.routed(self._headers_ns, took)
        self._before_ns = before if parsed.stream else 0  # a streaming client's first chunk is timed too
        return out

    def _serve_hit(self, ctx: RequestContext, admitted: Admitted) -> list[messages.ProcessingResponse]:
        """A cache hit answers the client from the picker: no engine, no upstream request."""
        flow = self._flow
        response = admitted.hit
        assert response is not None
        record = flow.hit_record(ctx, admitted, call=self._door.pipeline.answer_call)
        flow.finish(ctx, status=200, usage=Usage(), records=[record])
        if admitted.parsed.stream:
            body = b"".join(replay_chunks(response, include_usage=admitted.parsed.include_usage))
            return self._immediate(GatewayResponse(200, flow.headers(ctx), body, media_type="text/event-stream"))
        return self._immediate(GatewayResponse(200, flow.headers(ctx), orjson.dumps(response)))

    # ---- response -----------------------------------------------------------------------------

    def _response_headers(self, req: messages.ProcessingRequest) -> list[messages.ProcessingResponse]:
        ctx, choice = self._ctx, self._choice
        if ctx is None or choice is None or self.done:
            return [messages.response_headers(set_headers={})]
        headers = messages.header_map(req.response_headers)
        attempt = choice.attempt
        served = messages.served_endpoint(req) or address_of(attempt.endpoint)
        self._retarget(served)
        status = int(headers.get(":status", "0") or 0)
        unreached = None
        if messages.connect_failed(req):  # the gateway's answer when it cannot connect (`Forwarder.open`)
            unreached = self._door.pipeline.forwarder.waker.unavailable(
                f"no engine could be reached: cannot connect to an engine of model {attempt.model!r}")
        self._answer = Answer(flow=self._flow, ctx=ctx, attempt=attempt, status=status,
                              retry_after=headers.get("retry-after"), assembled_upstream=self._assembled,
                              served_header={messages.SERVED: served}, unreached=unreached)
        if self._answer.mode != "relay":  # a refusal or an unreached engine: no chunk of an answer is relayed
            self._before_ns = 0
        return self._answer.headers()

    def _response_trailers(self) -> list[messages.ProcessingResponse]:
        """The engine's trailers (an HTTP/2 hop passes them on): they end the response, whose last body chunk
        came without end_of_stream, so the answer ends here and is settled as complete."""
        answer = self._answer
        if answer is None or answer.done:
            return [messages.trailers()]
        out = answer.body(b"", end=True)
        self._settled_if(answer.done)
        if any(o.HasField("immediate_response") for o in out):
            return out  # the answer was replaced: no trailers follow it
        return [*out, messages.trailers()]

    def _retarget(self, served: str) -> None:
        """The proxy served from a later endpoint of the list (the earlier ones failed): the scheduler's in-flight
        counts and health follow the endpoint that really serves."""
        choice = self._choice
        assert choice is not None
        attempt = choice.attempt
        if served == address_of(attempt.endpoint):
            return
        scheduler = self._flow.stages.scheduler
        for endpoint in choice.endpoints[1:]:
            if address_of(endpoint) == served:
                scheduler.on_complete(attempt.routing, attempt.endpoint, ok=False, usage=None)
                scheduler.on_connect_error(attempt.endpoint)
                scheduler.on_start(attempt.routing, endpoint)
                attempt.endpoint = endpoint
                return

    # ---- endings ------------------------------------------------------------------------------

    def _immediate(self, answer: GatewayResponse) -> list[messages.ProcessingResponse]:
        self.done = True
        self._uncount()
        return [messages.immediate(answer.status, answer.headers, answer.body, media_type=answer.media_type)]

    def _settled_if(self, done: bool) -> None:
        if done:
            self.done = True
            self._uncount()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._flow.metrics.in_flight.dec()

    def expire(self, ending: Ending) -> list[messages.ProcessingResponse]:
        """The stream's time is up (`lifetime`): the request ends now with the gateway's answer, settled, charged
        the engine's work so far and recorded."""
        if self.done:
            return []
        if self._answer is not None:
            out = self._answer.interrupt(ending)
            self._settled_if(True)
            return out
        flow = self._flow
        ctx = self._ctx if self._ctx is not None else flow.new_context(self._headers)  # still reading the request
        if self._choice is not None:  # sent upstream, no response headers yet: the proxy resets the engine's request
            attempt = self._choice.attempt
            flow.stages.scheduler.on_complete(attempt.routing, attempt.endpoint, ok=False, usage=None)
        return self._immediate(flow.error(ctx, ending.error()))

    def close(self) -> None:
        """The stream is over. Unless the answer was complete, the client left: charge and record it (499)."""
        if self.done:
            return
        self.done = True
        ctx, flow = self._ctx, self._flow
        if self._answer is not None:
            self._answer.abandon()
        elif ctx is not None and self._choice is not None:  # sent upstream, no response yet
            attempt = self._choice.attempt
            flow.stages.scheduler.on_complete(attempt.routing, attempt.endpoint, ok=False, usage=None)
            flow.finish(ctx, status=499, usage=ctx.unanswered_usage(), records=flow.rejected_records(ctx, 499))
        elif ctx is not None:
            flow.finish(ctx, status=499, usage=ctx.unanswered_usage(), records=flow.rejected_records(ctx, 499))
        self._uncount()
