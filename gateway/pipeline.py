"""The request pipeline: everything between the HTTP layer and the engines, with no web framework.

Order: authenticate from the header (401; before the body is even read, see `fastpath`) -> parse +
validate (400) -> authorize the requested model or alias (403) -> known model or alias (404) -> reserve
against limits (429) -> cache lookup (hit: answer, settle zero engine usage) -> tier resolution, whose
concrete models are authorized too (`authorization`) -> endpoint picking and forwarding (fallbacks, one connect
retry) -> optional cascade escalation (non-streaming) -> relay -> settle, record, cache store.
Settling, recording and storing run after the response, in tasks the pipeline tracks (`drain`).
`admit` (authorize to tier) and the finishing steps are shared with the other API routes (`api_pipeline`:
`/v1/responses`, `/v1/messages`, `/v1/embeddings`), so every route is metered, budgeted and routed alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn, Protocol

import aiohttp
import orjson

from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.core.errors import (
    FleetGateError,
    InvalidRequestError,
    UpstreamBadResponseError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from fleetgate.core.types import Usage
from fleetgate.gateway.answercheck import start_answer_check
from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.authorization import (
    REFUSED_MODEL,
    UNKNOWN_MODEL,
    authorized_decision,
    shown,
    unknown_model,
    visible_to,
)
from fleetgate.gateway.collect import answer_of, capped, charged_usage, collect_stream
from fleetgate.gateway.context import Attempt, GatewayResponse, RequestContext, request_id_from
from fleetgate.gateway.discovery import models_page, served_names, serves, task_of
from fleetgate.gateway.drain import Activity
from fleetgate.gateway.engine_usage import fallback_usage, parse_usage
from fleetgate.gateway.errors import InternalGatewayError, error_body, from_engine
from fleetgate.gateway.estimate import RequestEstimate
from fleetgate.gateway.forwarding import BodyBuilder, Forwarder, assembled_upstream
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.parsing import Kind, ParsedRequest, parse_request
from fleetgate.gateway.replay import replay_chunks
from fleetgate.gateway.reserving import Reserver
from fleetgate.gateway.settings import GatewaySettings, ServerSettings
from fleetgate.gateway.stages import RequestRecord, Tenant
from fleetgate.gateway.stageset import Stages
from fleetgate.gateway.streaming import RelayStream, ReplayStream, StreamOutcome
from fleetgate.gateway.upstream import read_body
from fleetgate.gateway.wake import Waker
from fleetgate.router.tiers.types import TierDecision

SAMPLED_OPT_IN = "x-fleetgate-cache-sampled"
# How a stream that did not end well is recorded (`StreamOutcome.error_kind`); anything else: 502.
STREAM_END_STATUS = {"timeout": 504, "deadline": 504, "shutdown": 503}
HITS = (CacheStatus.HIT_EXACT, CacheStatus.HIT_SEMANTIC)


@dataclass(frozen=True, slots=True)
class ReserveShape:
    """What a request is reserved as (`reserving.Reserver.reserve`): the body to bound (as the engine renders it),
    its prompts field, the client's output limit (0: nothing is generated), the kind `/tokenize` can count (None:
    the bound decides) and a route's own adjustment of the estimate (`adjust(estimate, context)`)."""

    body: Mapping[str, Any]
    prompts_field: str | None
    max_tokens: int | None
    kind: Kind | None = None
    adjust: Callable[[RequestEstimate, int | None], RequestEstimate] | None = None
    count_body: Mapping[str, Any] | None = None  # the request as the exact counter takes it, when `body` is a view

ErrorRenderer = Callable[[FleetGateError], bytes]  # an error as the route's API writes it


class AnswerShape(Protocol):
    """Another API's non-streaming answer (`api_route`): whether `obj` is one, and its usage (None: unknown)."""

    def is_answer(self, obj: dict[str, Any]) -> bool: ...

    def usage_of(self, obj: dict[str, Any]) -> Usage | None: ...


Runner = Callable[["RequestContext", Kind, bytes, Mapping[str, str], "Tenant | None"], Awaitable["GatewayResponse"]]


@dataclass(slots=True)
class Admitted:
    """An admitted request: a cache hit to answer with (`decision` None), or the targets to route to, in order."""

    lookup: CacheLookup
    decision: TierDecision | None = None

    @property
    def targets(self) -> list[tuple[str, str | None]]:
        assert self.decision is not None
        return [(self.decision.model, self.decision.tier), *self.decision.fallbacks]


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
        self._reserver = Reserver(settings=settings, source=stages.endpoint_source, limiter=stages.limiter,
                                  session=session)
        self._tasks: set[asyncio.Task[None]] = set()
        self.activity = Activity()  # requests in flight and open engine streams, for a draining shutdown
        self._log = logging.getLogger("fleetgate.gateway.requests")

    # ---- public -------------------------------------------------------------------------------

    @property
    def waker(self) -> Waker:
        """Scale from zero: the requests held while a model wakes."""
        return self._forwarder.waker

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant:
        """The caller's tenant from the `authorization` header alone (cheap: one hash and a dict lookup)."""
        return await self._s.auth.authenticate(headers.get("authorization"))

    async def is_admin(self, *, headers: Mapping[str, str]) -> bool:
        """Whether the `authorization` header holds an admin key (no key, a wrong one, or auth off: False)."""
        try:
            tenant = await self._s.auth.authenticate(headers.get("authorization"))
        except FleetGateError:
            return False
        return tenant.is_admin

    def refuse(self, *, headers: Mapping[str, str], exc: FleetGateError,
               render: ErrorRenderer = error_body) -> GatewayResponse:
        """The answer to a request refused before its body was read (counted like any other)."""
        ctx = RequestContext(request_id=request_id_from(headers), received_at=time.perf_counter())
        return self._error(ctx, exc, render)

    async def handle(
        self, *, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None = None,
        run: Runner | None = None, render: ErrorRenderer = error_body,
    ) -> GatewayResponse:
        """`headers` must have lower-case names; `tenant`: already authenticated (`authenticate`).
        Never raises: every failure becomes a response. `run`: another API route's own steps (`api_pipeline`),
        whose errors `render` writes in that API's shape."""
        ctx = RequestContext(request_id=request_id_from(headers), received_at=time.perf_counter())
        self._entered()
        try:
            response = await (run or self._run)(ctx, kind, raw, headers, tenant)
        except FleetGateError as exc:
            response = self._error(ctx, exc, render)
        except asyncio.CancelledError:  # the client left before a non-streaming answer: engine call aborted
            self._left()
            self._finish(ctx, status=499, usage=ctx.unanswered_usage(), records=self._rejected_records(ctx, 499))
            raise
        except Exception:
            self._log.exception("unexpected error", extra={"request_id": ctx.request_id})
            response = GatewayResponse(500, self._headers(ctx), render(InternalGatewayError(ctx.request_id)))
            self._finish(ctx, status=500, usage=Usage(), records=[])
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
        return [*served_names(self._s.endpoint_source), *self._s.tiers.aliases()]

    async def list_models(self, *, headers: Mapping[str, str]) -> GatewayResponse:
        ctx = RequestContext(request_id=request_id_from(headers), received_at=time.perf_counter())
        try:
            tenant = await self._s.auth.authenticate(headers.get("authorization"))
        except FleetGateError as exc:
            return GatewayResponse(exc.status, {**self._headers(ctx), **exc.headers}, error_body(exc))
        body = models_page(self._s.endpoint_source, aliases=self._s.tiers.aliases(), allowed=tenant.allowed_models,
                           tenant=tenant.id)
        return GatewayResponse(200, self._headers(ctx), body)

    async def drain(self) -> None:
        """Wait for the settle/record/store work of finished requests (and their scale-from-zero activity marks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._forwarder.waker.drain()

    # ---- the pipeline -------------------------------------------------------------------------

    async def _run(
        self, ctx: RequestContext, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None
    ) -> GatewayResponse:
        # Authenticate before parsing: an unauthenticated client must not cost JSON parsing of a big body.
        ctx.tenant = tenant if tenant is not None else await self.authenticate(headers=headers)
        ctx.authenticated = True
        parsed = parse_request(kind, raw, session_header=headers.get("x-session-id"))
        shape = ReserveShape(body=parsed.body, prompts_field=None if kind == "chat" else "prompt",
                             max_tokens=parsed.max_tokens, kind=kind)
        admitted = await self.admit(ctx, parsed, headers=headers, shape=shape,
                                    accept=partial(self._generative, kind=kind))
        if admitted.decision is None:
            return self._serve_hit(ctx, parsed, admitted.lookup)
        if parsed.stream:
            return await self._stream(ctx, parsed, admitted.targets)
        return await self._complete(ctx, parsed, admitted.targets)

    def _generative(self, model: str, *, kind: Kind) -> None:
        """Chat and completions: an embedding model is refused (400) before anything is reserved."""
        if task_of(self._s.endpoint_source, model) == "embed":
            raise InvalidRequestError(f"model {shown(model)} is an embedding model (an encoder): it answers "
                                      f"/v1/embeddings, not {kind} requests", param="model")

    async def admit(
        self, ctx: RequestContext, parsed: ParsedRequest, *, headers: Mapping[str, str], shape: ReserveShape,
        aliases: bool = True, accept: Callable[[str], None] | None = None,
    ) -> Admitted:
        """Everything between a parsed request of an authenticated tenant and the choice of an engine, for every
        API route: authorize the model (403), known model or alias (404), `accept(model)` (a route's own refusal
        of a model, 400), reserve what `shape` says the request may cost against limits and budgets (429), cache
        lookup, tier resolution (`aliases`: False for routes no alias may serve)."""
        ctx.parsed = parsed
        # Until the name is authorized and known it is the client's arbitrary string: records, ledger rows
        # and metric labels get a fixed placeholder instead, so they cannot grow with what clients send.
        ctx.model_label = REFUSED_MODEL
        self._s.auth.authorize(ctx.tenant, parsed.model)  # the tenant's own model list: 403
        ctx.model_label = UNKNOWN_MODEL
        source = self._s.endpoint_source
        names = self._s.tiers.aliases() if aliases else []
        known = serves(source, parsed.model) or parsed.model in names
        if not known or not visible_to(ctx.tenant, parsed.model, source=source):
            raise unknown_model(parsed.model, names=[*served_names(source, visible_to=ctx.tenant.id), *names])
        ctx.model_label = parsed.model
        if accept is not None:
            accept(parsed.model)
        reserved = await self._reserver.reserve(
            ctx.tenant, model=parsed.model, body=shape.body, prompts_field=shape.prompts_field,
            max_tokens=shape.max_tokens, kind=shape.kind, adjust=shape.adjust, count_body=shape.count_body)
        ctx.reservation, ctx.completion_cap = reserved.reservation, reserved.completion_cap
        ctx.prompt_estimate = reserved.estimate.typical
        lookup = await self._lookup(ctx, parsed, headers)
        if lookup.status in HITS and lookup.response is not None:
            return Admitted(lookup=lookup)
        decision = authorized_decision(await self._resolve(ctx, parsed, lookup), tenant=ctx.tenant, auth=self._s.auth,
                                       source=self._s.endpoint_source)
        ctx.tier = decision
        ctx.served_model, ctx.served_tier = decision.model, decision.tier  # until an engine call says otherwise
        return Admitted(lookup=lookup, decision=decision)

    async def _lookup(self, ctx: RequestContext, parsed: ParsedRequest, headers: Mapping[str, str]) -> CacheLookup:
        directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
        req = CacheRequest(
            tenant=ctx.tenant.id,
            model=parsed.model,  # the requested name: an alias is its own cache partition
            kind=parsed.kind,
            body=parsed.body,
            no_cache="no-cache" in directives,
            no_store="no-store" in directives,
            allow_sampled=headers.get(SAMPLED_OPT_IN, "").lower() in ("1", "true", "yes"),
        )
        ctx.cache_request = req
        try:
            lookup = await self._s.cache.lookup(req)
        except Exception:  # the cache fails open: a broken cache must not fail requests
            self._log.exception("cache lookup failed", extra={"request_id": ctx.request_id})
            lookup = CacheLookup(status=CacheStatus.BYPASS, reason="cache error")
        ctx.lookup = lookup
        return lookup

    async def _resolve(self, ctx: RequestContext, parsed: ParsedRequest, lookup: CacheLookup) -> TierDecision:
        try:
            if ctx.tenant.allowed_models is not None:
                # The alias picks among the tiers this tenant may use (`authorized_decision` re-checks the result).
                return await self._s.tiers.resolve(parsed.model, parsed.prompt_text, embedding=lookup.embedding,
                                                   allowed_models=ctx.tenant.allowed_models)
            return await self._s.tiers.resolve(parsed.model, parsed.prompt_text, embedding=lookup.embedding)
        except FleetGateError:
            raise
        except Exception as exc:  # a broken tier router must not take explicit models down with it
            self._log.exception("tier resolution failed", extra={"request_id": ctx.request_id})
            if serves(self._s.endpoint_source, parsed.model):
                return TierDecision(model=parsed.model, reason="tier router error")
            raise UpstreamUnavailableError(f"cannot resolve model alias {parsed.model!r}: {exc}") from exc

    def _serve_hit(self, ctx: RequestContext, parsed: ParsedRequest, lookup: CacheLookup) -> GatewayResponse:
        assert lookup.response is not None
        response = lookup.response
        ctx.served_model = str(response.get("model") or parsed.model)
        record = self._record(ctx, model=ctx.served_model, tier=None, endpoint=None,
                              usage=Usage.from_openai(response.get("usage")), status=200)
        headers = self._headers(ctx)
        start_answer_check(cache=self._s.cache, ctx=ctx, lookup=lookup, call=self._call,
                           finished=self._forwarder.finished, record=self._s.accountant.record,
                           served=self._s.endpoint_source.models)
        if not parsed.stream:
            self._finish(ctx, status=200, usage=Usage(), records=[record])
            return GatewayResponse(200, headers, orjson.dumps(response))

        def done(ok: bool) -> None:
            self._left()
            self._finish(ctx, status=200 if ok else 499, usage=Usage(), records=[record])

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
            usage = self._charged(ctx, attempt, out)
            ctx.spent = (ctx.spent or Usage()) + usage
            self._s.scheduler.on_complete(attempt.routing, ep, ok=out.ok and out.assembled is not None, usage=usage)
            done.append((out, usage))

        timed_out = await collect_stream(resp, endpoint_id=ep.id, kind=ctx.parsed.kind, server=self._server,
                                         on_done=on_done, completion_cap=ctx.completion_cap, streams=self.activity)
        [(out, usage)] = done
        self._check_collected(attempt, out, timed_out=timed_out)
        obj = answer_of(out, usage, model=attempt.model if ep.model != attempt.model else ep.model)
        return attempt, obj, usage, orjson.dumps(obj)

    def _check_collected(self, attempt: Attempt, out: StreamOutcome, *, timed_out: bool) -> None:
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

    def _charged(self, ctx: RequestContext, attempt: Attempt, out: StreamOutcome) -> Usage:
        if out.bad_usage:
            self._m.upstream_errors.labels(attempt.model, attempt.endpoint.id, "bad_usage").inc()
        return charged_usage(out, prompt_estimate=ctx.prompt_estimate, completion_cap=ctx.completion_cap)

    async def _complete(
        self, ctx: RequestContext, parsed: ParsedRequest, targets: list[tuple[str, str | None]]
    ) -> GatewayResponse:
        attempt, obj, usage, body = await self._call(ctx, targets)
        records = [self._record(ctx, model=attempt.model, tier=attempt.tier,
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
                records.append(self._record(ctx, model=attempt2.model, tier=attempt2.tier,
                                            endpoint=attempt2.endpoint.id, usage=usage2, status=200))
                records[-1].extra["cascade"] = f"escalation of {records[0].model}: {reason}"
        store = obj if ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS else None
        self._finish(ctx, status=200, usage=total, records=records, store=store)
        return GatewayResponse(200, self._headers(ctx, attempt), body)

    async def _stream(
        self, ctx: RequestContext, parsed: ParsedRequest, targets: list[tuple[str, str | None]]
    ) -> GatewayResponse:
        attempt, resp = await self._forwarder.open(ctx, targets, stream=True)
        ctx.served_model, ctx.served_tier = attempt.model, attempt.tier
        ep = attempt.endpoint
        if resp.status != 200:
            await self._refused(ctx, attempt, resp)
        assemble = ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS

        def done(out: StreamOutcome) -> None:
            self.activity.closed(relay)
            self._stream_done(ctx, attempt, out, usage=self._charged(ctx, attempt, out), store=out.assembled)

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
            spawn=self._spawn,
        )
        self.activity.opened(relay)
        return GatewayResponse(200, self._headers(ctx, attempt), stream=relay, media_type="text/event-stream")

    async def _refused(self, ctx: RequestContext, attempt: Attempt, resp: aiohttp.ClientResponse) -> NoReturn:
        """The engine answered a stream with an error status: relay its (sanitized) error; it did no work."""
        ctx.spent = ctx.spent or Usage()
        ep = attempt.endpoint
        try:
            raw = await read_body(resp, endpoint=ep, timeout_s=self._server.first_byte_timeout_s)
        finally:
            self._s.scheduler.on_complete(attempt.routing, ep, ok=False, usage=None)
        self._m.upstream_errors.labels(attempt.model, ep.id, "status").inc()
        raise from_engine(resp.status, raw, endpoint=ep.id, retry_after=resp.headers.get("Retry-After"))

    def _stream_done(self, ctx: RequestContext, attempt: Attempt, out: StreamOutcome, *, usage: Usage,
                     store: dict[str, Any] | None) -> None:
        """A stream to the client ended (completed, broke off, timed out, or the client left): charge `usage`,
        tell the scheduler, record, finish (`store`: the answer for the cache)."""
        self._left()
        ep = attempt.endpoint
        self._s.scheduler.on_complete(attempt.routing, ep, ok=out.ok, usage=usage)
        if out.error_kind and out.error_kind != "shutdown":  # ended by this gateway, not the engine's fault
            self._m.upstream_errors.labels(attempt.model, ep.id, out.error_kind).inc()
        status = 200 if out.ok else 499 if out.cancelled else STREAM_END_STATUS.get(out.error_kind or "", 502)
        record = self._record(ctx, model=attempt.model, tier=attempt.tier, endpoint=ep.id, usage=usage, status=status)
        record.stream = True
        if out.first_token_at is not None:
            record.ttft_s = out.first_token_at - ctx.received_at
        if out.cancelled:
            record.extra["cancelled"] = "client disconnected"
        self._finish(ctx, status=status, usage=usage, records=[record], store=store, outcome=out)

    # ---- responses, records, finishing --------------------------------------------------------

    def _rejected_records(self, ctx: RequestContext, status: int) -> list[RequestRecord]:
        """The record of a request that got no answer (only once the tenant is known)."""
        if not ctx.authenticated or ctx.parsed is None:
            return []
        model = ctx.served_model or ctx.model_label
        endpoint = ctx.attempts[-1].endpoint.id if ctx.attempts else None
        return [self._record(ctx, model=model, tier=ctx.served_tier, endpoint=endpoint, usage=ctx.unanswered_usage(),
                             status=status)]

    def _error(self, ctx: RequestContext, exc: FleetGateError, render: ErrorRenderer = error_body) -> GatewayResponse:
        records = self._rejected_records(ctx, exc.status)
        self._finish(ctx, status=exc.status, usage=ctx.unanswered_usage(), records=records)
        return GatewayResponse(exc.status, {**self._headers(ctx), **exc.headers}, render(exc))

    def _headers(self, ctx: RequestContext, attempt: Attempt | None = None) -> dict[str, str]:
        headers = {"x-request-id": ctx.request_id}
        if ctx.served_model:
            headers["x-fleetgate-model"] = ctx.served_model
        if ctx.served_tier:
            headers["x-fleetgate-tier"] = ctx.served_tier
        if ctx.lookup is not None:
            cache = ctx.lookup.status.value
            if ctx.lookup.similarity is not None:
                cache += f"; similarity={ctx.lookup.similarity:.4f}"
            headers["x-fleetgate-cache"] = cache
        if self._server.debug_headers and attempt is not None:
            headers["x-fleetgate-endpoint"] = attempt.endpoint.id
            reasons = attempt.decision.reasons
            headers["x-fleetgate-route-reasons"] = (
                ",".join(f"{k}={v:.3f}" for k, v in reasons.items()) or attempt.decision.profile
            )
        return headers

    def _record(
        self, ctx: RequestContext, *, model: str, tier: str | None, endpoint: str | None, usage: Usage, status: int
    ) -> RequestRecord:
        parsed = ctx.parsed
        return RequestRecord(
            request_id=ctx.request_id,
            tenant=ctx.tenant,
            model=model,
            tier=tier,
            endpoint=endpoint,
            usage=usage,
            status=status,
            stream=bool(parsed and parsed.stream),
            cache_status=ctx.lookup.status.value if ctx.lookup is not None else CacheStatus.BYPASS.value,
            duration_s=time.perf_counter() - ctx.received_at,
        )

    def _finish(
        self,
        ctx: RequestContext,
        *,
        status: int,
        usage: Usage,
        records: list[RequestRecord],
        store: dict[str, Any] | None = None,
        outcome: StreamOutcome | None = None,
    ) -> None:
        """Metrics and the log line now; settle, record and cache store in a tracked task."""
        if ctx.finished:
            return
        ctx.finished = True
        self._forwarder.finished(ctx)
        now = time.perf_counter()
        model = ctx.served_model or ""
        tier = ctx.served_tier or ""
        tenant = ctx.tenant.id
        cache = ctx.lookup.status.value if ctx.lookup is not None else "none"
        self._m.requests.labels(model, tier, tenant, str(status), cache).inc()
        self._m.duration.labels(model, tier, tenant).observe(now - ctx.received_at)
        if outcome is not None and outcome.first_token_at is not None:
            self._m.ttft.labels(model, tier, tenant).observe(outcome.first_token_at - ctx.received_at)
            if outcome.last_token_at is not None and usage.completion_tokens > 1:
                tpot = (outcome.last_token_at - outcome.first_token_at) / (usage.completion_tokens - 1)
                self._m.tpot.labels(model, tier, tenant).observe(tpot)
        for record in records:
            record.duration_s = now - ctx.received_at
        if self._server.log_requests:
            self._log.info("request", extra={
                "request_id": ctx.request_id, "tenant": tenant, "model": model, "tier": tier, "status": status,
                "cache": cache, "stream": bool(ctx.parsed and ctx.parsed.stream),
                "duration_ms": round((now - ctx.received_at) * 1000, 3),
                "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                "endpoint": ctx.attempts[-1].endpoint.id if ctx.attempts else None,
            })
        if ctx.reservation is None and not records and store is None:
            return
        self._spawn(self._settle(ctx, usage, records, store))

    async def _settle(
        self, ctx: RequestContext, usage: Usage, records: list[RequestRecord], store: dict[str, Any] | None
    ) -> None:
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if ctx.reservation is not None:
            steps.append(("settle", partial(self._s.limiter.settle, ctx.reservation, usage)))
        steps.extend(("record", partial(self._s.accountant.record, r)) for r in records)
        if store is not None and ctx.cache_request is not None and ctx.lookup is not None:
            steps.append(("cache store", partial(self._s.cache.store, ctx.cache_request, ctx.lookup, store)))
        for name, step in steps:
            try:
                await step()
            except Exception:
                self._log.exception(f"{name} failed", extra={"request_id": ctx.request_id})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- what the other API routes (`api_pipeline`: responses, messages, embeddings) use -------------------

    @property
    def stages(self) -> Stages:
        return self._s

    @property
    def metrics(self) -> GatewayMetrics:
        return self._m

    @property
    def server(self) -> ServerSettings:
        return self._server

    @property
    def forwarder(self) -> Forwarder:
        return self._forwarder

    entered = _entered
    left = _left
    finish = _finish
    record = _record
    headers = _headers
    rejected_records = _rejected_records
    charged = _charged
    spawn = _spawn
    refused = _refused
    stream_done = _stream_done
    call = _call
    check_collected = _check_collected
