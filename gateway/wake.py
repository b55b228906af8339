"""Scale from zero: hold the requests for a model scaled to zero, wake it, let them go when it is ready.

The design follows KubeAI's proxy (and the KEDA HTTP add-on's interceptor): the gateway, which sees the
requests, is what scales a service up from zero; the operator only scales idle services down.

For a model with no endpoint whose source can wake it (`WakeableSource.wake_targets` is not empty):
- the first request opens a *hold* for the model. One task per hold sets every target's replicas through
  the InferenceService's scale subresource (one call per target per hold, however many requests wait),
  then polls discovery every `poll_s` until the model has an endpoint;
- each request joins the hold (at most `max_held_per_model` at a time; more get 503 at once) and waits at
  most `wait_s` from its own arrival. All of them proceed when the first endpoint is ready; one that runs
  out of time gets 503 with `Retry-After`;
- a request that leaves (its task is cancelled) leaves the hold, and the last one out cancels the hold's
  task: nothing outlives its waiters. A failed scale call fails the waiting requests at once (503), and
  the next request tries again with a new hold.
Each request for a wakeable model also marks it active, at most once per `active_mark_s` per model (the
operator's idle scale-down reads the mark), and while engine calls of the model are in flight (`begin` /
`end`, paired by the forwarder) a heartbeat keeps marking it every `active_mark_s`, so a long generation is
never taken for idleness. Models that cannot be woken pass straight through.

Metrics: `fleetgate_scale_from_zero_wakes_total{model,outcome}` counts wakes (holds), once each: `ready`,
`scale_failed`, or, when its last waiter goes before the model is ready, `timeout` / `abandoned`;
`fleetgate_scale_from_zero_requests_total{model,outcome}` counts the requests held, each with its own
outcome; `fleetgate_scale_from_zero_held_requests` is the number held now.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetgate.core.errors import UpstreamUnavailableError
from fleetgate.core.types import Endpoint
from fleetgate.gateway.discovery import EndpointSource, WakeableSource, WakeTarget
from fleetgate.gateway.settings import ScaleFromZeroSettings

log = logging.getLogger(__name__)


class _Hold:
    """The requests waiting for one model to wake, and the task that wakes it."""

    def __init__(self) -> None:
        self.waiters = 0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.counted = False  # the wake's outcome is counted once, whoever ends it


class Waker:
    def __init__(
        self, *, source: EndpointSource, settings: ScaleFromZeroSettings, registry: CollectorRegistry | None = None
    ) -> None:
        self._source = source
        registry = registry if registry is not None else CollectorRegistry()
        self._held_gauge = Gauge("fleetgate_scale_from_zero_held_requests",
                                 "Requests held while their model wakes from zero.", ["model"], registry=registry)
        self._wakes = Counter("fleetgate_scale_from_zero_wakes", "Scale-from-zero wakes (one per model woken) by "
                              "outcome (ready, timeout, scale_failed, abandoned).", ["model", "outcome"],
                              registry=registry)
        self._held_requests = Counter("fleetgate_scale_from_zero_requests",
                                      "Requests held while their model woke, by outcome (ready, timeout, "
                                      "scale_failed, abandoned).", ["model", "outcome"], registry=registry)
        self._s = settings
        self._wakeable = source if settings.enabled and isinstance(source, WakeableSource) else None
        self._holds: dict[str, _Hold] = {}
        self._marked: dict[str, float] = {}  # model -> monotonic time of its last activity mark
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, int] = {}  # wakeable model -> engine calls in flight
        self._heartbeat: asyncio.Task[None] | None = None

    def unavailable(self, message: str) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(message, headers={"Retry-After": str(self._s.retry_after_s)})

    def held(self, model: str) -> int:
        """Requests now held for `model`."""
        hold = self._holds.get(model)
        return hold.waiters if hold is not None else 0

    async def endpoints(self, model: str) -> list[Endpoint]:
        """The model's endpoints; for a model scaled to zero that can be woken, once it has one (held until
        then). Raises `UpstreamUnavailableError` (503, Retry-After) when the wait fails."""
        endpoints = self._source.endpoints(model)
        if self._wakeable is None:
            return endpoints
        targets = self._wakeable.wake_targets(model)
        if not targets:
            return endpoints
        self._mark(model)
        if endpoints:
            return endpoints
        return await self._hold(model, targets)

    def begin(self, model: str) -> None:
        """An engine call of `model` started (only wakeable models, those marked active, are counted)."""
        if model not in self._marked:
            return
        self._in_flight[model] = self._in_flight.get(model, 0) + 1
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat())

    def end(self, model: str) -> None:
        count = self._in_flight.get(model, 0) - 1
        if count > 0:
            self._in_flight[model] = count
        else:
            self._in_flight.pop(model, None)

    def in_flight(self, model: str) -> int:
        return self._in_flight.get(model, 0)

    async def _beat(self) -> None:
        """Marks the models with calls in flight; ends when none are left."""
        while self._in_flight:
            await asyncio.sleep(self._s.active_mark_s)
            for model in list(self._in_flight):
                self._mark(model)

    async def drain(self) -> None:
        """Wait for the activity marks already under way; stop the heartbeat when no call is in flight."""
        if not self._in_flight and self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for hold in list(self._holds.values()):
            if hold.task is not None:
                hold.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _hold(self, model: str, targets: list[WakeTarget]) -> list[Endpoint]:
        hold = self._holds.get(model)
        if hold is None or hold.ready.done():  # a finished hold whose endpoints went again: wake anew
            hold = _Hold()
            self._holds[model] = hold
            hold.task = asyncio.create_task(self._wake(model, targets, hold))
        if hold.waiters >= self._s.max_held_per_model:
            raise self.unavailable(f"model {model!r} is starting and too many requests are waiting for it")
        hold.waiters += 1
        self._held_gauge.labels(model).inc()
        outcome = "abandoned"  # the client left (cancelled) unless set below
        try:
            await asyncio.wait_for(asyncio.shield(hold.ready), timeout=self._s.wait_s)
            outcome = "ready"
        except TimeoutError:
            outcome = "timeout"
            raise self.unavailable(
                f"model {model!r} was scaled to zero and has no ready engine after {self._s.wait_s:g} s; retry later"
            ) from None
        except UpstreamUnavailableError:
            outcome = "scale_failed"
            raise
        finally:
            self._held_requests.labels(model, outcome).inc()
            self._held_gauge.labels(model).dec()
            hold.waiters -= 1
            if hold.waiters == 0:
                if not hold.ready.done():  # the last waiter gave up before the model was ready
                    self._count(model, hold, "timeout" if outcome == "timeout" else "abandoned")
                self._close(model, hold)
        return self._source.endpoints(model)

    def _count(self, model: str, hold: _Hold, outcome: str) -> None:
        if not hold.counted:
            hold.counted = True
            self._wakes.labels(model, outcome).inc()

    def _close(self, model: str, hold: _Hold) -> None:
        if self._holds.get(model) is hold:
            del self._holds[model]
        if hold.task is not None and not hold.task.done():
            hold.task.cancel()
        if not hold.ready.done():
            hold.ready.cancel()

    async def _wake(self, model: str, targets: list[WakeTarget], hold: _Hold) -> None:
        assert self._wakeable is not None
        try:
            for target in targets:
                log.info("scale from zero: %s/%s to %d replicas for model %r",
                         target.namespace, target.name, target.replicas, model)
                await self._wakeable.scale(target)
            # Sources have no change notification; one poll loop per hold, not one per request.
            while not self._source.endpoints(model):  # noqa: ASYNC110
                await asyncio.sleep(self._s.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. 403 on inferenceservices/scale: the waiting requests fail now
            log.warning("scale from zero: cannot scale up model %r: %s", model, exc)
            if self._holds.get(model) is hold:
                del self._holds[model]  # the next request tries again
            if not hold.ready.done():
                self._count(model, hold, "scale_failed")
                hold.ready.set_exception(self.unavailable(f"model {model!r} is scaled to zero and could not be woken"))
            return
        if not hold.ready.done():
            self._count(model, hold, "ready")
            hold.ready.set_result(None)

    def _mark(self, model: str) -> None:
        now = time.monotonic()
        last = self._marked.get(model)
        if last is not None and now - last < self._s.active_mark_s:
            return
        self._marked[model] = now
        task = asyncio.create_task(self._mark_active(model))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark_active(self, model: str) -> None:
        assert self._wakeable is not None
        try:
            await self._wakeable.mark_active(model)
        except Exception as exc:  # the mark is advisory: a failure must not fail requests
            log.warning("scale from zero: cannot mark model %r active: %s", model, exc)
