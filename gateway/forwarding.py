"""Choosing an engine and opening the call: tier fallbacks, endpoint picking, one connect retry.

For each (model, tier) in order — the tier's model first, then `TierDecision.fallbacks` — the
scheduler picks an endpoint among the model's endpoints. A connect failure (nothing reached the
engine) is reported with `scheduler.on_connect_error` and retried once on `Decision.fallbacks[0]`;
if that fails too, or the model has no usable endpoint, the next fallback model is tried. Nothing
is retried once the engine answered: the first response (any status) is returned. A model scaled to
zero is woken first (`Waker` holds the request until it has an endpoint). When no engine serves, the
503 carries `Retry-After`.

A LoRA adapter (a name the source's `AdapterCatalog` lists) is routed among its base model's endpoints
with `RoutingRequest.adapter` set, forwarded with `model: <adapter>` (vLLM selects the LoRA by it), and
loaded first where the picked endpoint lacks it (`AdapterLoader`); a failed load moves on to the next
endpoint like a connect failure. An engine that answers 404 for an adapter the gateway believed loaded
there (it restarted, or unloaded it since the last scrape) did no work: the adapter is loaded again and
the request resent to it, once; a second 404 there counts as a failed load. Waking and activity marks go
to the base model.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from fleetgate.core.adapters import AdapterSpec
from fleetgate.core.errors import FleetGateError, FleetSaturatedError, UpstreamUnavailableError
from fleetgate.core.types import Endpoint
from fleetgate.gateway.adapter_loading import AdapterLoader, AdapterLoadFailed
from fleetgate.gateway.context import Attempt, RequestContext
from fleetgate.gateway.discovery import EndpointSource, adapter_named
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.settings import ServerSettings
from fleetgate.gateway.upstream import ConnectFailed, send, sent_ns
from fleetgate.gateway.wake import Waker
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.types import Decision, RoutingRequest, Scheduler

log = logging.getLogger("fleetgate.gateway.upstream")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
API_PATHS = {"responses": "/v1/responses", "messages": "/v1/messages", "embeddings": "/v1/embeddings"}
BodyBuilder = Callable[[str, int | None], bytes]  # (served model name, max_tokens to set or None) -> body
FORCED_STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


# Non-streaming requests with these are not streamed upstream: `StreamAssembler` does not rebuild them.
NOT_ASSEMBLED = ("tools", "functions", "logprobs", "top_logprobs", "echo", "prompt_logprobs")


def assembled_upstream(body: dict[str, Any]) -> bool:
    """Whether a non-streaming request is streamed from the engine and assembled by the gateway, so that a
    client who leaves (or an engine that breaks off) still leaves the usage of the work done so far."""
    best_of = body.get("best_of")
    return not any(body.get(k) for k in NOT_ASSEMBLED) and not (isinstance(best_of, int) and best_of > 1)


def upstream_body(body: dict[str, Any], *, served_name: str, stream: bool, raw: bytes = b"",
                  max_tokens: int | None = None) -> bytes:
    """The client's body for the engine: its served model name, `max_tokens` when the client set none and
    the gateway bounded it (`Reservation.max_tokens`), and, when streaming, usage on every chunk.
    A non-streaming body that already names the served model is forwarded as received (`raw`)."""
    if raw and not stream and body.get("model") == served_name and max_tokens is None:
        return raw
    out = dict(body)
    out["model"] = served_name
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if stream:
        out["stream"] = True
        out["stream_options"] = FORCED_STREAM_OPTIONS
    return orjson.dumps(out)


def address_of(endpoint: Endpoint) -> str:
    """`host:port` of an endpoint's base URL: how a proxy names it (`x-gateway-destination-endpoint`)."""
    parts = urlsplit(endpoint.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Problems:
    """Why targets were passed over: for the log (names endpoints and addresses) and for the client (models)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.public: list[str] = []
        self.saturated: FleetSaturatedError | None = None

    def add(self, logged: str, public: str | None = None) -> None:
        self.log.append(logged)
        self.public.append(logged if public is None else public)


@dataclass(slots=True)
class Choice:
    """Where the Endpoint Picker sends a request: the attempt (model, tier, first endpoint) and every endpoint
    the proxy may try, in order, all serving `attempt.model`."""

    attempt: Attempt
    endpoints: list[Endpoint]
    served_name: str | None  # the model name the engine is asked for when not the endpoint's (an adapter)


class Forwarder:
    def __init__(
        self,
        *,
        server: ServerSettings,
        endpoint_source: EndpointSource,
        scheduler: Scheduler,
        metrics: GatewayMetrics,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self._server = server
        self._scheduler = scheduler
        self._metrics = metrics
        self._session = session
        self._source = endpoint_source
        self.waker = Waker(source=endpoint_source, settings=server.scale_from_zero, registry=metrics.registry)
        state = getattr(scheduler, "state", None)
        self.adapters = AdapterLoader(session=session, timeout_s=server.adapter_load_timeout_s,
                                      state=state if isinstance(state, FleetState) else None,
                                      registry=metrics.registry)

    def _base(self, model: str) -> str:
        """The model whose engines serve `model`: an adapter's base, else the model itself."""
        spec = adapter_named(self._source, model)
        return spec.base if spec is not None else model

    def _attempted(self, ctx: RequestContext, attempt: Attempt) -> None:
        """Every attempt is recorded here, so the waker's in-flight count is ended once per attempt (`finished`)."""
        ctx.attempts.append(attempt)
        self.waker.begin(self._base(attempt.model))

    def finished(self, ctx: RequestContext) -> None:
        """The request is over: its engine calls no longer keep their models active."""
        for attempt in ctx.attempts:
            self.waker.end(self._base(attempt.model))

    async def open(
        self, ctx: RequestContext, targets: list[tuple[str, str | None]], *, stream: bool,
        build: BodyBuilder | None = None,
    ) -> tuple[Attempt, aiohttp.ClientResponse]:
        """`build(served_name, max_tokens)`: the engine's body for a route other than chat and completions
        (`api_route`); its path is the route's own."""
        parsed = ctx.parsed
        assert parsed is not None
        path = PATHS.get(parsed.kind) or API_PATHS[parsed.kind]
        timeout = self._server.first_byte_timeout_s if stream else self._server.request_timeout_s
        cap = ctx.reservation.max_tokens if ctx.reservation is not None and parsed.max_tokens is None else None
        attempts = _Problems()
        for index, (model, tier) in enumerate(targets):
            if index:
                self._metrics.retries.labels(model).inc()
            routed = await self._route(ctx, model, attempts)
            if routed is None:
                continue
            spec, routing, decision = routed
            tries: deque[Endpoint] = deque([decision.endpoint, *decision.fallbacks[:1]])
            reloaded: set[str] = set()
            attempt_no = -1
            while tries:
                endpoint = tries.popleft()
                attempt_no += 1
                if attempt_no:
                    self._metrics.retries.labels(model).inc()
                if spec is not None:
                    try:
                        await self.adapters.ensure(endpoint, spec)
                    except AdapterLoadFailed as exc:
                        attempts.add(str(exc), f"adapter {model!r} could not be loaded on an engine of {spec.base!r}")
                        continue
                served = spec.name if spec is not None else endpoint.model
                body = (build(served, cap) if build is not None else
                        upstream_body(parsed.body, served_name=served, stream=stream, raw=parsed.raw, max_tokens=cap))
                # on_start before sending and on_complete on every failure keep in-flight counts balanced.
                self._scheduler.on_start(routing, endpoint)
                posting_ns = perf_counter_ns()  # `own_time`: the gateway's stages end, aiohttp's request write begins
                try:
                    response = await send(
                        self._session(), endpoint, path, body, request_id=ctx.request_id, headers_timeout_s=timeout
                    )
                except ConnectFailed as exc:
                    self._scheduler.on_complete(routing, endpoint, ok=False, usage=None)
                    self._scheduler.on_connect_error(endpoint)
                    self._metrics.upstream_errors.labels(model, endpoint.id, "connect").inc()
                    attempts.add(str(exc), f"cannot connect to an engine of model {model!r}")
                    continue
                except FleetGateError as exc:
                    kind = "timeout" if exc.status == 504 else "bad_response"
                    self._metrics.upstream_errors.labels(model, endpoint.id, kind).inc()
                    self._scheduler.on_complete(routing, endpoint, ok=False, usage=None)
                    raise
                except asyncio.CancelledError:
                    self._scheduler.on_complete(routing, endpoint, ok=False, usage=None)
                    # The request may have reached the engine: the pipeline charges its estimate.
                    self._attempted(ctx, Attempt(model=model, tier=tier, endpoint=endpoint, routing=routing,
                                                 decision=decision))
                    raise
                if spec is not None and response.status == 404:
                    # The engine lost the adapter the gateway believed loaded there (a restart, an unload the
                    # scraper has not seen yet): it did no work, so load it again and resend, once. A second
                    # 404 (it says it loads but never does) moves on like a failed load: the client is not
                    # told that a model the gateway lists does not exist.
                    response.release()
                    self._scheduler.on_complete(routing, endpoint, ok=False, usage=None)
                    self.adapters.forget(endpoint.id, spec.name)
                    if endpoint.id not in reloaded:
                        reloaded.add(endpoint.id)
                        tries.appendleft(endpoint)
                    else:
                        attempts.add(f"{endpoint.id} answered 404 for adapter {spec.name!r} after loading it",
                                     f"adapter {model!r} could not be loaded on an engine of {spec.base!r}")
                    continue
                if not ctx.before_upstream_ns:  # the request's first answered engine call: the gateway's own time
                    ctx.before_upstream_ns = self._metrics.own.before_upstream(ctx.arrived_ns, sent_ns(response),
                                                                                posting_ns)
                attempt = Attempt(model=model, tier=tier, endpoint=endpoint, routing=routing, decision=decision)
                self._attempted(ctx, attempt)
                return attempt, response
        raise self._none_reached(ctx, attempts)

    async def choose(
        self, ctx: RequestContext, targets: list[tuple[str, str | None]], *, allowed: set[str] | None = None
    ) -> Choice:
        """Where to send the request, without sending it (the Endpoint Picker's door: the proxy sends it). The
        same walk as `open`: the first target with a usable endpoint wins; its pick and the scheduler's
        fallbacks, all of that model, are the ordered list the proxy tries. `allowed`: the only addresses
        (`ip:port`) that may be picked (the proxy's subset hint). An adapter is loaded on the pick first."""
        attempts = _Problems()
        for index, (model, tier) in enumerate(targets):
            if index:
                self._metrics.retries.labels(model).inc()
            routed = await self._route(ctx, model, attempts, allowed=allowed)
            if routed is None:
                continue
            spec, routing, decision = routed
            ordered = [decision.endpoint, *decision.fallbacks]
            if spec is not None:
                ordered = await self._with_adapter(ordered, spec, attempts)
                if not ordered:
                    continue
            attempt = Attempt(model=model, tier=tier, endpoint=ordered[0], routing=routing, decision=decision)
            self._scheduler.on_start(routing, ordered[0])
            self._attempted(ctx, attempt)
            return Choice(attempt=attempt, endpoints=ordered, served_name=spec.name if spec is not None else None)
        raise self._none_reached(ctx, attempts)

    async def _with_adapter(self, ordered: list[Endpoint], spec: AdapterSpec, attempts: _Problems) -> list[Endpoint]:
        """`ordered` from the first endpoint that has (or could load) the adapter."""
        for i, endpoint in enumerate(ordered):
            try:
                await self.adapters.ensure(endpoint, spec)
            except AdapterLoadFailed as exc:
                attempts.add(str(exc), f"adapter {spec.name!r} could not be loaded on an engine of {spec.base!r}")
                continue
            return ordered[i:]
        return []

    async def _route(
        self, ctx: RequestContext, model: str, attempts: _Problems, *, allowed: set[str] | None = None
    ) -> tuple[AdapterSpec | None, RoutingRequest, Decision] | None:
        """The scheduler's decision for `model` (for an adapter: among its base's endpoints), or None with the
        reason added to `attempts`."""
        parsed = ctx.parsed
        assert parsed is not None
        spec = adapter_named(self._source, model)
        try:
            # holds while a model scaled to zero wakes (for an adapter: its base)
            endpoints = await self.waker.endpoints(spec.base if spec is not None else model)
        except UpstreamUnavailableError as exc:
            attempts.add(exc.message, exc.message)
            return None
        if allowed is not None:
            endpoints = [e for e in endpoints if address_of(e) in allowed]
        if not endpoints:
            attempts.add(f"no endpoint serves model {model!r}" + (" in the proxy's subset" if allowed is not None
                                                                  else ""))
            return None
        routing = RoutingRequest(
            request_id=ctx.request_id,
            model=model,
            prompt_text=parsed.prompt_text,
            tenant=ctx.tenant.id,
            session_key=parsed.session_key,
            max_tokens=parsed.max_tokens,
            adapter=spec.name if spec is not None else None,
            kind=parsed.kind,
            body=parsed.body,
        )
        try:
            decision = await self._scheduler.pick(routing, endpoints)
        except UpstreamUnavailableError as exc:  # the scheduler's messages name models, not endpoints
            attempts.add(exc.message, exc.message)
            return None
        except FleetSaturatedError as exc:  # shed: a fallback model may still have room
            attempts.saturated = exc
            attempts.add(exc.message, exc.message)
            return None
        return spec, routing, decision

    def _none_reached(self, ctx: RequestContext, attempts: _Problems) -> FleetGateError:
        # The problems name endpoints and addresses: the log keeps them, the client gets none.
        log.warning("no engine reached", extra={"problems": attempts.log, "request_id": ctx.request_id})
        if attempts.saturated is not None:
            return attempts.saturated
        return self.waker.unavailable("no engine could be reached: " + "; ".join(dict.fromkeys(attempts.public)))
