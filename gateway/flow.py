"""The stages both front doors drive, with no framing: admission before an engine is chosen, accounting after.

FleetGate has two front doors: its own HTTP gateway (`pipeline.Pipeline` behind `fastpath`) and the Endpoint
Picker that any Gateway API inference gateway asks over Envoy ext_proc (`fleetgate.gateway.epp`). Both run
every request through this one object, so a feature is written once and only the framing differs:

- `admit`: authenticate from the header (401) -> parse + validate (400) -> authorize the requested model or
  alias against the tenant's list (403) -> known model or alias, and visible to this tenant (404: another
  tenant's private adapter answers exactly as an unknown name) -> the route's own refusal of a model (400:
  chat and completions refuse an embedding model) -> reserve against limits and budgets
  (`reserving.Reserver`: the prompt bound or exact count, and the completion cap; 429) -> cache lookup ->
  on a miss, tier resolution whose concrete models are authorized too (`authorization`). The result says
  what to serve: a cache hit, or the (model, tier) targets in order (the tier's choice, then its fallbacks).
  `admit_parsed` is the same from the authorization on, for a request another API route parsed itself
  (`api_pipeline`: responses, messages, embeddings), reserved as its `ReserveShape` says.
- `stream_done`: what a streamed engine answer is charged and recorded as (also when the client left); never
  more completion tokens than the cap (`ctx.completion_cap`), whatever the engine reports.
- `finish`: metrics and the log line now; settle the reservation, record the request and store the answer
  in the cache in a task the flow tracks (`drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp

from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.core.errors import FleetGateError, InvalidRequestError, UpstreamUnavailableError
from fleetgate.core.tasks import cancel_and_wait
from fleetgate.core.types import Usage
from fleetgate.gateway.answercheck import Call, start_answer_check
from fleetgate.gateway.authorization import (
    REFUSED_MODEL,
    UNKNOWN_MODEL,
    authorized_decision,
    shown,
    unknown_model,
    visible_to,
)
from fleetgate.gateway.collect import charged_usage
from fleetgate.gateway.context import Attempt, GatewayResponse, RequestContext, request_id_from
from fleetgate.gateway.discovery import models_page, served_names, serves, task_of
from fleetgate.gateway.errors import error_body
from fleetgate.gateway.estimate import RequestEstimate
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.parsing import Kind, ParsedRequest, parse_request
from fleetgate.gateway.reserving import Reserver
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import RequestRecord, Tenant, Unwritten
from fleetgate.gateway.stageset import Stages
from fleetgate.gateway.streaming import StreamOutcome
from fleetgate.gateway.unwritten import report as report_unwritten
from fleetgate.router.tiers.types import TierDecision

SAMPLED_OPT_IN = "x-fleetgate-cache-sampled"
# How a stream that did not end well is recorded (`StreamOutcome.error_kind`); anything else: 502.
STREAM_END_STATUS = {"timeout": 504, "deadline": 504, "shutdown": 503}
HITS = (CacheStatus.HIT_EXACT, CacheStatus.HIT_SEMANTIC)

ErrorRenderer = Callable[[FleetGateError], bytes]  # an error as the route's API writes it


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


@dataclass(slots=True)
class Admitted:
    """An admitted request: a cache hit to answer with, or the (model, tier) targets to route to, in order."""

    parsed: ParsedRequest
    lookup: CacheLookup
    decision: TierDecision | None = None  # None: a cache hit

    @property
    def hit(self) -> dict[str, Any] | None:
        """The cached response, when this is a hit."""
        return self.lookup.response if self.decision is None else None

    @property
    def targets(self) -> list[tuple[str, str | None]]:
        assert self.decision is not None
        return [(self.decision.model, self.decision.tier), *self.decision.fallbacks]


class Flow:
    def __init__(
        self,
        *,
        settings: GatewaySettings,
        stages: Stages,
        metrics: GatewayMetrics,
        session: Callable[[], aiohttp.ClientSession],
        on_finished: Callable[[RequestContext], None] = lambda ctx: None,
    ) -> None:
        self.stages = stages
        self.metrics = metrics
        self._server = settings.server
        self._on_finished = on_finished  # the door's own bookkeeping (the forwarder's scale-from-zero marks)
        self.reserver = Reserver(settings=settings, source=stages.endpoint_source, limiter=stages.limiter,
                                 session=session)
        self._tasks: set[asyncio.Task[None]] = set()
        self._unwritten: list[Unwritten] = []  # records a shutdown's cancellation kept from the accountant
        self._log = logging.getLogger("fleetgate.gateway.requests")

    # ---- before an engine is chosen -------------------------------------------------------------

    def new_context(self, headers: Mapping[str, str], *, arrived_ns: int = 0) -> RequestContext:
        """`arrived_ns`: when the web layer received the request (`own_time`), 0 where the door has no such clock."""
        return RequestContext(request_id=request_id_from(headers), received_at=time.perf_counter(),
                              arrived_ns=arrived_ns)

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant:
        """The caller's tenant from the `authorization` header alone (cheap: one hash and a dict lookup)."""
        return await self.stages.auth.authenticate(headers.get("authorization"))

    async def admit(
        self, ctx: RequestContext, *, kind: Kind, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None
    ) -> Admitted:
        """Everything before an engine is chosen; raises the `FleetGateError` a client is answered with.
        `headers` must have lower-case names; `tenant`: already authenticated (`authenticate`)."""
        # Authenticate before parsing: an unauthenticated client must not cost JSON parsing of a big body.
        ctx.tenant = tenant if tenant is not None else await self.authenticate(headers=headers)
        ctx.authenticated = True
        parsed = parse_request(kind, raw, session_header=headers.get("x-session-id"))
        shape = ReserveShape(body=parsed.body, prompts_field=None if kind == "chat" else "prompt",
                             max_tokens=parsed.max_tokens, kind=kind)
        return await self.admit_parsed(ctx, parsed, headers=headers, shape=shape,
                                       accept=partial(self._generative, kind=kind))

    def _generative(self, model: str, *, kind: Kind) -> None:
        """Chat and completions: an embedding model is refused (400) before anything is reserved."""
        if task_of(self.stages.endpoint_source, model) == "embed":
            raise InvalidRequestError(f"model {shown(model)} is an embedding model (an encoder): it answers "
                                      f"/v1/embeddings, not {kind} requests", param="model")

    async def admit_parsed(
        self, ctx: RequestContext, parsed: ParsedRequest, *, headers: Mapping[str, str], shape: ReserveShape,
        aliases: bool = True, accept: Callable[[str], None] | None = None,
    ) -> Admitted:
        """`admit` from the authorization on, for an authenticated tenant's parsed request (any API route):
        authorize the model (403), known model or alias (404), `accept(model)` (a route's own refusal of a
        model, 400), reserve what `shape` says the request may cost against limits and budgets (429), cache
        lookup, tier resolution (`aliases`: False for routes no alias may serve)."""
        s = self.stages
        ctx.parsed = parsed
        # Until the name is authorized and known it is the client's arbitrary string: records, ledger rows
        # and metric labels get a fixed placeholder instead, so they cannot grow with what clients send.
        ctx.model_label = REFUSED_MODEL
        s.auth.authorize(ctx.tenant, parsed.model)  # the tenant's own model list: 403
        ctx.model_label = UNKNOWN_MODEL
        source = s.endpoint_source
        names = s.tiers.aliases() if aliases else []
        known = serves(source, parsed.model) or parsed.model in names
        if not known or not visible_to(ctx.tenant, parsed.model, source=source):
            raise unknown_model(parsed.model, names=[*served_names(source, visible_to=ctx.tenant.id), *names])
        ctx.model_label = parsed.model
        if accept is not None:
            accept(parsed.model)
        reserved = await self.reserver.reserve(
            ctx.tenant, model=parsed.model, body=shape.body, prompts_field=shape.prompts_field,
            max_tokens=shape.max_tokens, kind=shape.kind, adjust=shape.adjust, count_body=shape.count_body)
        ctx.reservation, ctx.completion_cap = reserved.reservation, reserved.completion_cap
        ctx.prompt_estimate = reserved.estimate.typical
        lookup = await self._lookup(ctx, parsed, headers)
        if lookup.status in HITS and lookup.response is not None:
            return Admitted(parsed=parsed, lookup=lookup)
        decision = authorized_decision(await self._resolve(ctx, parsed, lookup), tenant=ctx.tenant, auth=s.auth,
                                       source=s.endpoint_source)
        ctx.tier = decision
        ctx.served_model, ctx.served_tier = decision.model, decision.tier  # until an engine call says otherwise
        return Admitted(parsed=parsed, lookup=lookup, decision=decision)

    def known_models(self) -> list[str]:
        return [*served_names(self.stages.endpoint_source), *self.stages.tiers.aliases()]

    async def list_models(self, *, headers: Mapping[str, str]) -> GatewayResponse:
        ctx = self.new_context(headers)
        try:
            tenant = await self.stages.auth.authenticate(headers.get("authorization"))
        except FleetGateError as exc:
            return GatewayResponse(exc.status, {**self.headers(ctx), **exc.headers}, error_body(exc))
        body = models_page(self.stages.endpoint_source, aliases=self.stages.tiers.aliases(),
                           allowed=tenant.allowed_models, tenant=tenant.id)
        return GatewayResponse(200, self.headers(ctx), body)

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
            lookup = await self.stages.cache.lookup(req)
        except Exception:  # the cache fails open: a broken cache must not fail requests
            self._log.exception("cache lookup failed", extra={"request_id": ctx.request_id})
            lookup = CacheLookup(status=CacheStatus.BYPASS, reason="cache error")
        ctx.lookup = lookup
        return lookup

    async def _resolve(self, ctx: RequestContext, parsed: ParsedRequest, lookup: CacheLookup) -> TierDecision:
        tiers, source = self.stages.tiers, self.stages.endpoint_source
        try:
            if ctx.tenant.allowed_models is not None:
                # The alias picks among the tiers this tenant may use (`authorized_decision` re-checks the result).
                return await tiers.resolve(parsed.model, parsed.prompt_text, embedding=lookup.embedding,
                                           allowed_models=ctx.tenant.allowed_models)
            return await tiers.resolve(parsed.model, parsed.prompt_text, embedding=lookup.embedding)
        except FleetGateError:
            raise
        except Exception as exc:  # a broken tier router must not take explicit models down with it
            self._log.exception("tier resolution failed", extra={"request_id": ctx.request_id})
            if serves(source, parsed.model):
                return TierDecision(model=parsed.model, reason="tier router error")
            raise UpstreamUnavailableError(f"cannot resolve model alias {parsed.model!r}: {exc}") from exc

    # ---- answers ------------------------------------------------------------------------------

    def hit_record(self, ctx: RequestContext, admitted: Admitted, *, call: Call | None) -> RequestRecord:
        """A cache hit is being served: its record (zero engine usage), and the answer check offered to the
        cache (`call`: how the door asks an engine; None: no checks through this door)."""
        response = admitted.hit
        assert response is not None
        ctx.served_model = str(response.get("model") or admitted.parsed.model)
        record = self.record(ctx, model=ctx.served_model, tier=None, endpoint=None,
                             usage=Usage.from_openai(response.get("usage")), status=200)
        if call is not None:
            s = self.stages
            start_answer_check(cache=s.cache, ctx=ctx, lookup=admitted.lookup, call=call, finished=self._on_finished,
                               record=s.accountant.record, served=s.endpoint_source.models)
        return record

    def charged(self, ctx: RequestContext, attempt: Attempt, out: StreamOutcome) -> Usage:
        if out.bad_usage:
            self.metrics.upstream_errors.labels(attempt.model, attempt.endpoint.id, "bad_usage").inc()
        return charged_usage(out, prompt_estimate=ctx.prompt_estimate, completion_cap=ctx.completion_cap)

    def stream_done(self, ctx: RequestContext, attempt: Attempt, out: StreamOutcome, *, usage: Usage | None = None,
                    store: bool = True) -> None:
        """A streamed engine answer ended (completed, broke off, timed out, or the client left): charge what the
        engine did (`usage`: a route's own charge of it; None: `charged`), tell the scheduler, record and finish
        (`store`: the assembled answer goes to the cache)."""
        if usage is None:
            usage = self.charged(ctx, attempt, out)
        ep = attempt.endpoint
        self.stages.scheduler.on_complete(attempt.routing, ep, ok=out.ok, usage=usage)
        if out.error_kind and out.error_kind != "shutdown":  # ended by this gateway, not the engine's fault
            self.metrics.upstream_errors.labels(attempt.model, ep.id, out.error_kind).inc()
        status = 200 if out.ok else 499 if out.cancelled else STREAM_END_STATUS.get(out.error_kind or "", 502)
        record = self.record(ctx, model=attempt.model, tier=attempt.tier, endpoint=ep.id, usage=usage, status=status)
        record.stream = True
        if out.first_token_at is not None:
            record.ttft_s = out.first_token_at - ctx.received_at
        if out.cancelled:
            record.extra["cancelled"] = "client disconnected"
        self.finish(ctx, status=status, usage=usage, records=[record], store=out.assembled if store else None,
                    outcome=out)

    def rejected_records(self, ctx: RequestContext, status: int) -> list[RequestRecord]:
        """The record of a request that got no answer (only once the tenant is known)."""
        if not ctx.authenticated or ctx.parsed is None:
            return []
        model = ctx.served_model or ctx.model_label
        endpoint = ctx.attempts[-1].endpoint.id if ctx.attempts else None
        return [self.record(ctx, model=model, tier=ctx.served_tier, endpoint=endpoint, usage=ctx.unanswered_usage(),
                            status=status)]

    def error(self, ctx: RequestContext, exc: FleetGateError, render: ErrorRenderer = error_body) -> GatewayResponse:
        """The answer to a refused or failed request (OpenAI-shaped, or as `render` writes the route's API); the
        request is finished (and charged what the engine did, if it was reached)."""
        records = self.rejected_records(ctx, exc.status)
        self.finish(ctx, status=exc.status, usage=ctx.unanswered_usage(), records=records)
        return GatewayResponse(exc.status, {**self.headers(ctx), **exc.headers}, render(exc))

    def headers(self, ctx: RequestContext, attempt: Attempt | None = None) -> dict[str, str]:
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

    def record(
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

    # ---- finishing ----------------------------------------------------------------------------

    def finish(
        self,
        ctx: RequestContext,
        *,
        status: int,
        usage: Usage,
        records: list[RequestRecord],
        store: dict[str, Any] | None = None,
        outcome: StreamOutcome | None = None,
    ) -> None:
        """Metrics and the log line now; settle, record and cache store in a tracked task. Once per request."""
        if ctx.finished:
            return
        ctx.finished = True
        self._on_finished(ctx)
        m = self.metrics
        now = time.perf_counter()
        model = ctx.served_model or ""
        tier = ctx.served_tier or ""
        tenant = ctx.tenant.id
        cache = ctx.lookup.status.value if ctx.lookup is not None else "none"
        m.requests.labels(model, tier, tenant, str(status), cache).inc()
        m.duration.labels(model, tier, tenant).observe(now - ctx.received_at)
        if outcome is not None and outcome.first_token_at is not None:
            m.ttft.labels(model, tier, tenant).observe(outcome.first_token_at - ctx.received_at)
            if outcome.last_token_at is not None and usage.completion_tokens > 1:
                tpot = (outcome.last_token_at - outcome.first_token_at) / (usage.completion_tokens - 1)
                m.tpot.labels(model, tier, tenant).observe(tpot)
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
        self.spawn(self._settle(ctx, usage, records, store))

    async def _settle(
        self, ctx: RequestContext, usage: Usage, records: list[RequestRecord], store: dict[str, Any] | None
    ) -> None:
        s = self.stages
        steps: list[tuple[str, Callable[[], Awaitable[None]], RequestRecord | None]] = []
        if ctx.reservation is not None:
            steps.append(("settle", partial(s.limiter.settle, ctx.reservation, usage), None))
        steps.extend(("record", partial(s.accountant.record, r), r) for r in records)
        if store is not None and ctx.cache_request is not None and ctx.lookup is not None:
            steps.append(("cache store", partial(s.cache.store, ctx.cache_request, ctx.lookup, store), None))
        for i, (name, step, _) in enumerate(steps):
            try:
                await step()
            except asyncio.CancelledError:
                # The shutdown deadline (`shutdown`): the records not yet handed to the accountant are reported; the
                # one it was writing is its own to keep (`unwritten()`).
                self._unwritten.extend(Unwritten(
                    request_id=r.request_id, tenant=r.tenant.id, model=r.model, tier=r.tier or "", usage=r.usage,
                    cost_micros=None, attempted=False) for _, _, r in steps[i + 1:] if r is not None)
                raise
            except Exception:
                self._log.exception(f"{name} failed", extra={"request_id": ctx.request_id})

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in a task `drain` waits for (work that outlives a request's answer)."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the settle/record/store work of finished requests."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self, *, timeout_s: float) -> int:
        """The last drain of a stopping gateway, bounded: wait at most `timeout_s` for the settle/record/store work
        (each request's runs in its own task, so they all wait on the store at once, not one after another), cancel
        what is left, give the accountant's writes that failed earlier one more try in the time left, then report
        every request whose usage was not confirmed written (`unwritten.report`). Returns how many were reported."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._tasks:
            tasks = list(self._tasks)
            left = deadline - loop.time()
            if left > 0:
                await asyncio.wait(tasks, timeout=left)
                continue
            # cancel_and_wait re-cancels: on Python 3.11 a cancel landing as redis-py's wait_for completes is dropped,
            # and a settle task stalled on Redis would then keep the process from exiting (core.tasks)
            with contextlib.suppress(Exception):  # a task's own failure was logged where it ran
                await cancel_and_wait(*tasks)
            self._log.warning("shutdown: settle and record writes not done by server.settle_s; cancelled",
                              extra={"requests": len(tasks), "settle_s": timeout_s})
        accountant: Any = self.stages.accountant
        flush = getattr(accountant, "flush", None)
        left = deadline - loop.time()
        if flush is not None and left > 0:
            try:
                async with asyncio.timeout(left):
                    await flush()
            except TimeoutError:
                pass
        unwritten = getattr(accountant, "unwritten", None)
        items = [*self._unwritten, *(unwritten() if unwritten is not None else [])]
        self._unwritten.clear()
        report_unwritten(items, self.metrics)
        return len(items)
