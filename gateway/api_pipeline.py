"""One API route (`api_route.ApiRoute`: responses, messages, embeddings) through the gateway's own stages.

Order, as for chat (`pipeline`): authenticate from the route's header (401, before the body is read:
`fastpath`) -> parse + validate (400) -> `route.prepare` (a Responses follow-up's stored conversation: 404)
-> `Pipeline.admit` (the shared `flow.Flow.admit_parsed`): the tenant's model list (403), known model (404),
the model's task (an embedding model answers `/v1/embeddings` only), reserve the route's estimate against
limits and budgets (429), cache lookup, tier -> forward through the same forwarder (scheduler,
retries, fallbacks, scale from zero) -> relay -> settle, record, cache store. Every error is written in the
route's API shape (`route.render_error`).

Event-stream routes (responses, messages) are always streamed from the engine: a streaming client gets the
events relayed as they arrive (`event_relay`), a non-streaming one the answer collected from them, so in
both cases a client that leaves, an engine that breaks off or goes silent, and a shutdown leave the work
done so far, which is charged (`api_events.charged_events`). `route.completed` runs before the client can
have the answer (before the terminal event is relayed, or the body returned). Embeddings are one JSON body
(`Pipeline.call`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

import orjson

from fleetgate.cache.types import CacheLookup, CacheStatus
from fleetgate.core.errors import FleetGateError, InvalidRequestError
from fleetgate.core.types import Usage
from fleetgate.gateway.api_events import ApiEvents, charged_events
from fleetgate.gateway.api_route import ApiRoute
from fleetgate.gateway.authorization import shown
from fleetgate.gateway.collect import read_to_end
from fleetgate.gateway.context import Attempt, GatewayResponse, RequestContext
from fleetgate.gateway.discovery import task_of
from fleetgate.gateway.event_relay import EventRelay
from fleetgate.gateway.parsing import Kind, ParsedRequest
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.streaming import ReplayStream, StreamOutcome

log = logging.getLogger("fleetgate.gateway.requests")


class ApiPipeline:
    def __init__(self, *, pipeline: Pipeline, route: ApiRoute) -> None:
        self._p = pipeline
        self.route = route

    def render_error(self, exc: FleetGateError) -> bytes:
        return self.route.render_error(exc)

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant:
        return await self._p.flow.stages.auth.authenticate(self.route.authorization(headers))

    def refuse(self, *, headers: Mapping[str, str], exc: FleetGateError) -> GatewayResponse:
        return self._p.refuse(headers=headers, exc=exc, render=self.route.render_error)

    async def handle(self, *, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None = None,
                     arrived_ns: int = 0) -> GatewayResponse:
        """`headers` with lower-case names. Never raises: every failure is a response in the route's shape."""
        return await self._p.handle(kind=self.route.kind, raw=raw, headers=headers, tenant=tenant, run=self._run,
                                    render=self.route.render_error, arrived_ns=arrived_ns)

    async def _run(
        self, ctx: RequestContext, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None
    ) -> GatewayResponse:
        route = self.route
        ctx.tenant = tenant if tenant is not None else await self.authenticate(headers=headers)
        ctx.authenticated = True
        parsed = route.parse(raw, headers)
        ctx.parsed = parsed
        await route.prepare(parsed, ctx.tenant)
        admitted = await self._p.admit(ctx, parsed, headers=headers, shape=route.reserve_shape(parsed),
                                       aliases=route.aliases, accept=self._accept)
        if admitted.decision is None:
            return await self._serve_hit(ctx, parsed, admitted.lookup)
        if route.streamed:
            return await self._events(ctx, parsed, admitted.targets)
        attempt, _, usage, body = await self._p.call(ctx, admitted.targets, shape=route,
                                                       build=partial(self._body, parsed))
        record = self._p.flow.record(ctx, model=attempt.model, tier=attempt.tier, endpoint=attempt.endpoint.id,
                                usage=usage, status=200)
        self._p.flow.finish(ctx, status=200, usage=usage, records=[record])
        return GatewayResponse(200, self._p.flow.headers(ctx, attempt), body)

    def _accept(self, model: str) -> None:
        """A 400 before anything is reserved for an embedding model (`task: embed`) on the Responses or Messages
        route. `/v1/embeddings` takes any model: a static route is "generate" unless it says otherwise, and an
        engine that cannot embed refuses the request itself (nothing is charged for a refusal)."""
        if self.route.kind != "embeddings" and task_of(self._p.flow.stages.endpoint_source, model) == "embed":
            raise InvalidRequestError(f"model {shown(model)} is an embedding model (an encoder): it answers "
                                      "/v1/embeddings", param="model")

    def _body(self, parsed: ParsedRequest, served: str, max_tokens: int | None) -> bytes:
        return self.route.upstream_body(parsed, served=served, max_tokens=max_tokens)

    # ---- answers --------------------------------------------------------------------------------------------

    async def _serve_hit(self, ctx: RequestContext, parsed: ParsedRequest, lookup: CacheLookup) -> GatewayResponse:
        p, flow, route = self._p, self._p.flow, self.route
        assert lookup.response is not None
        response = route.from_cache(parsed, lookup.response)
        ctx.served_model = str(response.get("model") or parsed.model)
        record = flow.record(ctx, model=ctx.served_model, tier=None, endpoint=None,
                          usage=route.usage_of(response) or Usage(), status=200)
        await self._completed(ctx, parsed, response)
        if not parsed.stream:
            flow.finish(ctx, status=200, usage=Usage(), records=[record])
            return GatewayResponse(200, flow.headers(ctx), orjson.dumps(response))

        def done(ok: bool) -> None:
            p.left()
            flow.finish(ctx, status=200 if ok else 499, usage=Usage(), records=[record])

        stream = ReplayStream(route.replay(parsed, response), on_done=done)
        return GatewayResponse(200, flow.headers(ctx), stream=stream, media_type="text/event-stream")

    async def _completed(self, ctx: RequestContext, parsed: ParsedRequest, answer: dict[str, Any]) -> None:
        try:
            await self.route.completed(parsed, ctx.tenant, answer)
        except Exception:  # the client still gets its answer; a follow-up naming it will not find it
            log.exception("storing a completed answer failed", extra={"request_id": ctx.request_id})

    async def _events(
        self, ctx: RequestContext, parsed: ParsedRequest, targets: list[tuple[str, str | None]]
    ) -> GatewayResponse:
        p, flow, route, server = self._p, self._p.flow, self.route, self._p.server
        attempt, resp = await p.forwarder.open(ctx, targets, stream=True, build=partial(self._body, parsed))
        ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
        ep = attempt.endpoint
        if resp.status != 200:
            await p.refused(ctx, attempt, resp)
        rw = route.rewriter(parsed, endpoint_id=ep.id, model_name=attempt.model if ep.model != attempt.model else None,
                            cap=ctx.completion_cap, collect=not parsed.stream)
        rw.on_first_token = partial(flow.stages.scheduler.on_first_token, attempt.routing, ep)
        store = ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS
        ended: list[tuple[StreamOutcome, Usage]] = []

        def done(out: StreamOutcome) -> None:  # also when the client left: the work so far is charged
            p.activity.closed(relay)
            usage = self._charge(ctx, attempt, rw, out)
            if parsed.stream:
                p.stream_done(ctx, attempt, out, usage=usage, store=store)
                return
            ctx.spent = (ctx.spent or Usage()) + usage
            flow.stages.scheduler.on_complete(attempt.routing, ep, ok=out.ok and out.assembled is not None, usage=usage)
            ended.append((out, usage))

        async def completed(out: StreamOutcome) -> None:
            if out.assembled is not None:
                await self._completed(ctx, parsed, out.assembled)

        relay = EventRelay(
            response=resp, rewriter=rw, endpoint_id=ep.id, first_byte_timeout_s=server.first_byte_timeout_s,
            inter_chunk_timeout_s=server.inter_chunk_timeout_s, on_done=done, on_complete=completed,
            deadline=asyncio.get_running_loop().time() + server.stream_deadline_s if parsed.stream else None,
            cancel_drain_s=server.cancel_drain_s, cancel_finish_tokens=server.cancel_finish_tokens,
            spawn=flow.spawn if parsed.stream else None,
            # the gateway's own time on the first chunk (`own_time`): only a streaming client is handed one
            own=flow.metrics.own if parsed.stream else None, before_upstream_ns=ctx.before_upstream_ns,
        )
        p.activity.opened(relay)
        if parsed.stream:
            return GatewayResponse(200, flow.headers(ctx, attempt), stream=relay, media_type="text/event-stream")
        timed_out = await read_to_end(relay, timeout_s=server.request_timeout_s)
        [(out, usage)] = ended
        p.check_collected(attempt, out, timed_out=timed_out)
        assert out.assembled is not None
        record = flow.record(ctx, model=attempt.model, tier=attempt.tier, endpoint=ep.id, usage=usage, status=200)
        flow.finish(ctx, status=200, usage=usage, records=[record], store=out.assembled if store else None)
        return GatewayResponse(200, flow.headers(ctx, attempt), orjson.dumps(out.assembled))

    def _charge(self, ctx: RequestContext, attempt: Attempt, rw: ApiEvents, out: StreamOutcome) -> Usage:
        if out.bad_usage:
            self._p.flow.metrics.upstream_errors.labels(attempt.model, attempt.endpoint.id, "bad_usage").inc()
        return charged_events(out, known_prompt=rw.known_prompt, prompt_estimate=ctx.prompt_estimate,
                              completion_cap=ctx.completion_cap)
