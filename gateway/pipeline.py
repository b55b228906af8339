"""The HTTP front door's request pipeline: everything between the HTTP layer and the engines, with no web framework.

Admission and accounting are the `flow.Flow` both front doors share (see there for the order of the stages:
auth, limits, cache, tier). This door then picks an endpoint and forwards (`forwarding`: fallbacks, one
connect retry), optionally escalates a non-streaming answer (cascade), relays it, and finishes through the
flow (settle, record, cache store, in tasks the flow tracks: `drain`). A cache hit is answered from the
cache, replayed as SSE when the client streams. Every engine stream is held to the reservation's completion
cap and, streamed to a client, to `server.stream_deadline_s`; requests in flight and open streams are
counted in `activity`, which a draining shutdown waits for and then ends (`serve.GatewayServer`).
The other API routes (`api_pipeline`: `/v1/responses`, `/v1/messages`, `/v1/embeddings`) run through this door
too (`handle(run=...)`, `admit`, `call`, `refused`, `stream_done`), so every route is metered, budgeted and
routed alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, NoReturn, Protocol

import aiohttp
import orjson

from fleetgate.cache.types import CacheStatus
from fleetgate.core.errors import (
    FleetGateError,
    UpstreamBadResponseError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from fleetgate.core.types import Usage
from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.collect import answer_of, capped, collect_stream
from fleetgate.gateway.context import Attempt, GatewayResponse, RequestContext
from fleetgate.gateway.drain import Activity
from fleetgate.gateway.engine_usage import fallback_usage, parse_usage
from fleetgate.gateway.errors import InternalGatewayError, error_body, from_engine
from fleetgate.gateway.flow import Admitted, ErrorRenderer, Flow, ReserveShape
from fleetgate.gateway.forwarding import BodyBuilder, Forwarder, assembled_upstream
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.parsing import Kind, ParsedRequest
from fleetgate.gateway.replay import replay_chunks
from fleetgate.gateway.settings import GatewaySettings, ServerSettings
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.stageset import Stages
from fleetgate.gateway.streaming import RelayStream, ReplayStream, StreamOutcome
from fleetgate.gateway.upstream import read_body
from fleetgate.gateway.wake import Waker


class AnswerShape(Protocol):
    """Another API's non-streaming answer (`api_route`): whether `obj` is one, and its usage (None: unknown)."""

    def is_answer(self, obj: dict[str, Any]) -> bool: ...

    def usage_of(self, obj: dict[str, Any]) -> Usage | None: ...


Runner = Callable[["RequestContext", Kind, bytes, Mapping[str, str], "Tenant | None"], Awaitable["GatewayResponse"]]


class Pipeline:
    def __init__(
        self,
        *,
        settings: GatewaySettings,
        stages: Stages,
        metrics: GatewayMetrics,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self._server = settings.server
        self._s = stages
        self._m = metrics
        self._forwarder = Forwarder(
            server=settings.server,
            endpoint_source=stages.endpoint_source,
            scheduler=stages.scheduler,
            metrics=metrics,
            session=session,
        )
        self.flow = Flow(settings=settings, stages=stages, metrics=metrics, session=session,
                         on_finished=self._forwarder.finished)
        self.activity = Activity()  # requests in flight and open engine streams, for a draining shutdown
        self._log = logging.getLogger("fleetgate.gateway.requests")

    # ---- public -------------------------------------------------------------------------------

    @property
    def waker(self) -> Waker:
        """Scale from zero: the requests held while a model wakes."""
        return self._forwarder.waker

    @property
    def forwarder(self) -> Forwarder:
        return self._forwarder

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant:
        """The caller's tenant from the `authorization` header alone (cheap: one hash and a dict lookup)."""
        return await self.flow.authenticate(headers=headers)

    async def is_admin(self, *, headers: Mapping[str, str]) -> bool:
        """Whether the `authorization` header holds an admin key (no key, a wrong one, or auth off: False)."""
        try:
            tenant = await self.flow.authenticate(headers=headers)
        except FleetGateError:
            return False
        return tenant.is_admin

    def refuse(self, *, headers: Mapping[str, str], exc: FleetGateError,
               render: ErrorRenderer = error_body) -> GatewayResponse:
        """The answer to a request refused before its body was read (counted like any other)."""
        return self.flow.error(self.flow.new_context(headers), exc, render)

    async def handle(
        self, *, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None = None,
        run: Runner | None = None, render: ErrorRenderer = error_body, arrived_ns: int = 0,
    ) -> GatewayResponse:
        """`headers` must have lower-case names; `tenant`: already authenticated (`authenticate`).
        Never raises: every failure becomes a response. `run`: another API route's own steps (`api_pipeline`),
        whose errors `render` writes in that API's shape. `arrived_ns`: when the ASGI handler got the request
        (`own_time`; 0: unknown, the gateway's own time is then not measured)."""
        flow = self.flow
        ctx = flow.new_context(headers, arrived_ns=arrived_ns)
        self._entered()
        try:
            response = await (run or self._run)(ctx, kind, raw, headers, tenant)
        except FleetGateError as exc:
            response = flow.error(ctx, exc, render)
        except asyncio.CancelledError:  # the client left before a non-streaming answer: engine call aborted
            self._left()
            flow.finish(ctx, status=499, usage=ctx.unanswered_usage(), records=flow.rejected_records(ctx, 499))
            raise
        except Exception:
            self._log.exception("unexpected error", extra={"request_id": ctx.request_id})
            response = GatewayResponse(500, flow.headers(ctx), render(InternalGatewayError(ctx.request_id)))
            flow.finish(ctx, status=500, usage=Usage(), records=[])
        if response.stream is None:
            self._left()
        return response

    def _entered(self) -> None:
        self._m.in_flight.inc()
        self.activity.begin()

    def _left(self) -> None:
        self._m.in_flight.dec()
        self.activity.end()

    def known_models(self) -> list[str]:
        return self.flow.known_models()

    async def list_models(self, *, headers: Mapping[str, str]) -> GatewayResponse:
        return await self.flow.list_models(headers=headers)

    async def drain(self) -> None:
        """Wait for the settle/record/store work of finished requests (and their scale-from-zero activity marks)."""
        await self.flow.drain()
        await self._forwarder.waker.drain()

    async def shutdown(self, *, timeout_s: float) -> None:
        """A stopping gateway's last drain, all of it within `timeout_s` (`Flow.shutdown`: what the store did not
        confirm by then is reported, never waited for)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await self.flow.shutdown(timeout_s=timeout_s)
        try:
            async with asyncio.timeout_at(deadline):
                await self._forwarder.waker.drain()
        except TimeoutError:
            self._log.warning("shutdown: scale-from-zero activity marks not written by server.settle_s")

    async def answer_call(
        self, ctx: RequestContext, targets: list[tuple[str, str | None]]
    ) -> tuple[Attempt, dict[str, Any], Usage, bytes]:
        """One non-streaming engine call (the cache's answer checks ask engines through this, from either door)."""
        return await self._call(ctx, targets)

    # ---- the pipeline -------------------------------------------------------------------------

    async def _run(
        self, ctx: RequestContext, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None
    ) -> GatewayResponse:
        admitted = await self.flow.admit(ctx, kind=kind, raw=raw, headers=headers, tenant=tenant)
        if admitted.hit is not None:
            return self._serve_hit(ctx, admitted)
        if admitted.parsed.stream:
            return await self._stream(ctx, admitted.parsed, admitted.targets)
        return await self._complete(ctx, admitted.parsed, admitted.targets)

    def _serve_hit(self, ctx: RequestContext, admitted: Admitted) -> GatewayResponse:
        response, parsed = admitted.hit, admitted.parsed
        assert response is not None
        record = self.flow.hit_record(ctx, admitted, call=self._call)
        headers = self.flow.headers(ctx)
        if not parsed.stream:
            self.flow.finish(ctx, status=200, usage=Usage(), records=[record])
            return GatewayResponse(200, headers, orjson.dumps(response))

        def done(ok: bool) -> None:
            self._left()
            self.flow.finish(ctx, status=200 if ok else 499, usage=Usage(), records=[record])

        chunks = replay_chunks(response, include_usage=parsed.include_usage)
        return GatewayResponse(200, headers, stream=ReplayStream(chunks, on_done=done), media_type="text/event-stream")

    async def _call(
        self, ctx: RequestContext, targets: list[tuple[str, str | None]], *, shape: AnswerShape | None = None,
        build: BodyBuilder | None = None,
    ) -> tuple[Attempt, dict[str, Any], Usage, bytes]:
        """One non-streaming engine call: the parsed answer and the bytes for the client (the engine's
        own unless the model name is rewritten or the answer was assembled from a stream). Engine errors
        are raised as OpenAI-shaped errors; the engine's work so far is added to `ctx.spent` either way.
        `shape` and `build`: another API route's answer and body (`api_route`), never assembled."""
        assert ctx.parsed is not None
        assembled = shape is None and assembled_upstream(ctx.parsed.body)
        attempt, resp = await self._forwarder.open(ctx, targets, stream=assembled, build=build)
        ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
        ep = attempt.endpoint
        if assembled and resp.status == 200:
            return await self._collect(ctx, attempt, resp)
        try:
            raw = await read_body(resp, endpoint=ep, timeout_s=self._server.request_timeout_s)
            if resp.status != 200:
                ctx.spent = ctx.spent or Usage()  # the engine refused: no work done
                self._m.upstream_errors.labels(attempt.model, ep.id, "status").inc()
                raise from_engine(resp.status, raw, endpoint=ep.id, retry_after=resp.headers.get("Retry-After"))
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict) or not (shape.is_answer(obj) if shape is not None
                                                 else isinstance(obj.get("choices"), list)):
                self._m.upstream_errors.labels(attempt.model, ep.id, "bad_response").inc()
                raise UpstreamBadResponseError("the engine returned a response that is not an answer of the API")
        except (FleetGateError, asyncio.CancelledError):
            self._s.scheduler.on_complete(attempt.routing, ep, ok=False, usage=None)
            raise
        usage = shape.usage_of(obj) if shape is not None else parse_usage(obj.get("usage"))
        if usage is None:
            self._m.upstream_errors.labels(attempt.model, ep.id, "bad_usage").inc()
            usage = fallback_usage(prompt_estimate=ctx.prompt_estimate, output_chunks=0)
        usage = capped(usage, ctx.completion_cap)  # an engine that ignored max_tokens: not charged beyond it
        ctx.spent = (ctx.spent or Usage()) + usage
        self._s.scheduler.on_complete(attempt.routing, ep, ok=True, usage=usage)
        if ep.model != attempt.model:
            obj["model"] = attempt.model
            raw = orjson.dumps(obj)
        return attempt, obj, usage, raw

    async def _collect(
        self, ctx: RequestContext, attempt: Attempt, resp: aiohttp.ClientResponse
    ) -> tuple[Attempt, dict[str, Any], Usage, bytes]:
        """Read a streamed engine answer to its end and assemble the non-streaming response."""
        assert ctx.parsed is not None
        ep = attempt.endpoint
        done: list[tuple[StreamOutcome, Usage]] = []

        def on_done(out: StreamOutcome) -> None:  # also when the client left: the usage so far is charged
            usage = self.flow.charged(ctx, attempt, out)
            ctx.spent = (ctx.spent or Usage()) + usage
            self._s.scheduler.on_complete(attempt.routing, ep, ok=out.ok and out.assembled is not None, usage=usage)
            done.append((out, usage))

        timed_out = await collect_stream(resp, endpoint_id=ep.id, kind=ctx.parsed.kind, server=self._server,
                                         on_done=on_done, completion_cap=ctx.completion_cap, streams=self.activity,
                                         on_first_token=partial(self._s.scheduler.on_first_token, attempt.routing, ep))
        [(out, usage)] = done
        self.check_collected(attempt, out, timed_out=timed_out)
        obj = answer_of(out, usage, model=attempt.model if ep.model != attempt.model else ep.model)
        return attempt, obj, usage, orjson.dumps(obj)

    def check_collected(self, attempt: Attempt, out: StreamOutcome, *, timed_out: bool) -> None:
        """The error for a non-streaming answer whose engine stream did not end well (none when it did)."""
        ep = attempt.endpoint
        if out.error_kind == "shutdown":
            raise UpstreamUnavailableError("the gateway is shutting down; retry the request")
        if timed_out or out.error_kind == "timeout":
            self._m.upstream_errors.labels(attempt.model, ep.id, "timeout").inc()
            raise UpstreamTimeoutError("the engine did not finish its response in time")
        if not out.ok or out.assembled is None:
            self._m.upstream_errors.labels(attempt.model, ep.id, out.error_kind or "bad_response").inc()
            raise UpstreamBadResponseError("the engine broke off or sent an answer the gateway cannot assemble")

    async def _complete(
        self, ctx: RequestContext, parsed: ParsedRequest, targets: list[tuple[str, str | None]]
    ) -> GatewayResponse:
        attempt, obj, usage, body = await self._call(ctx, targets)
        records = [self.flow.record(ctx, model=attempt.model, tier=attempt.tier,
                                    endpoint=attempt.endpoint.id, usage=usage, status=200)]
        total = usage
        decision = ctx.tier
        reason = None
        if decision is not None and decision.escalate_to:
            reason = self._s.tiers.should_escalate(obj)
        if reason and decision is not None and decision.escalate_to:
            self._m.escalations.labels(attempt.model, decision.escalate_to).inc()
            records[0].extra["cascade"] = f"escalated: {reason}"
            try:
                attempt2, obj2, usage2, body2 = await self._call(
                    ctx, [(decision.escalate_to, decision.escalate_tier)]
                )
            except FleetGateError as exc:  # the cheap answer still serves the client
                records[0].extra["escalation_failed"] = exc.message
                ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
            else:
                attempt, obj, body = attempt2, obj2, body2
                total = total + usage2
                records.append(self.flow.record(ctx, model=attempt2.model, tier=attempt2.tier,
                                                endpoint=attempt2.endpoint.id, usage=usage2, status=200))
                records[-1].extra["cascade"] = f"escalation of {records[0].model}: {reason}"
        store = obj if ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS else None
        self.flow.finish(ctx, status=200, usage=total, records=records, store=store)
        return GatewayResponse(200, self.flow.headers(ctx, attempt), body)

    async def _stream(
        self, ctx: RequestContext, parsed: ParsedRequest, targets: list[tuple[str, str | None]]
    ) -> GatewayResponse:
        attempt, resp = await self._forwarder.open(ctx, targets, stream=True)
        ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
        ep = attempt.endpoint
        if resp.status != 200:
            await self.refused(ctx, attempt, resp)
        assemble = ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS

        def done(out: StreamOutcome) -> None:
            self.activity.closed(relay)
            self._left()
            self.flow.stream_done(ctx, attempt, out)

        relay = RelayStream(
            response=resp,
            endpoint_id=ep.id,
            first_byte_timeout_s=self._server.first_byte_timeout_s,
            inter_chunk_timeout_s=self._server.inter_chunk_timeout_s,
            include_usage=parsed.include_usage,
            continuous_usage=parsed.continuous_usage,
            model_name=attempt.model if ep.model != attempt.model else None,
            assembler=StreamAssembler(parsed.kind) if assemble else None,
            on_done=done,
            completion_cap=ctx.completion_cap,
            deadline=asyncio.get_running_loop().time() + self._server.stream_deadline_s,
            cancel_drain_s=self._server.cancel_drain_s,
            cancel_finish_tokens=self._server.cancel_finish_tokens,
            spawn=self.flow.spawn,
            on_first_token=partial(self._s.scheduler.on_first_token, attempt.routing, ep),
            own=self._m.own,
            before_upstream_ns=ctx.before_upstream_ns,
        )
        self.activity.opened(relay)
        return GatewayResponse(200, self.flow.headers(ctx, attempt), stream=relay, media_type="text/event-stream")

    async def refused(self, ctx: RequestContext, attempt: Attempt, resp: aiohttp.ClientResponse) -> NoReturn:
        """The engine answered a stream with an error status: relay its (sanitized) error; it did no work."""
        ctx.spent = ctx.spent or Usage()
        ep = attempt.endpoint
        try:
            raw = await read_body(resp, endpoint=ep, timeout_s=self._server.first_byte_timeout_s)
        finally:
            self._s.scheduler.on_complete(attempt.routing, ep, ok=False, usage=None)
        self._m.upstream_errors.labels(attempt.model, ep.id, "status").inc()
        raise from_engine(resp.status, raw, endpoint=ep.id, retry_after=resp.headers.get("Retry-After"))

    # ---- what the other API routes (`api_pipeline`: responses, messages, embeddings) use -------------------

    @property
    def server(self) -> ServerSettings:
        return self._server

    async def admit(
        self, ctx: RequestContext, parsed: ParsedRequest, *, headers: Mapping[str, str], shape: ReserveShape,
        aliases: bool = True, accept: Callable[[str], None] | None = None,
    ) -> Admitted:
        """The shared flow's admission of a request another route parsed (`flow.Flow.admit_parsed`)."""
        return await self.flow.admit_parsed(ctx, parsed, headers=headers, shape=shape, aliases=aliases, accept=accept)

    def stream_done(self, ctx: RequestContext, attempt: Attempt, out: StreamOutcome, *, usage: Usage,
                    store: bool) -> None:
        """A route's stream to the client ended: it leaves this door, charged `usage` (`flow.Flow.stream_done`)."""
        self._left()
        self.flow.stream_done(ctx, attempt, out, usage=usage, store=store)

    entered = _entered
    left = _left
    call = _call
