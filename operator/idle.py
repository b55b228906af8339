"""Idle scale-down: an InferenceService with `spec.scaleToZeroAfterSeconds` that had no request for that
long is scaled to zero; the next request through the gateway wakes it (`fleetgate.gateway.wake`).

Idle time is measured from the newest of the gateway's `fleetgate.io/last-request` annotation (stamped at
most every `server.scale_from_zero.active_mark_s`, 30 s by default, while requests arrive, and when a request
wakes the service) and the object's `creationTimestamp` (a service nobody asked for is idle since it was
created). The scale-down is one merge patch of the InferenceService: `spec.replicas: 0` and
`fleetgate.io/wake-replicas` = the replicas it had, which the gateway restores on wake. The gateway keeps
re-stamping the mark while engine calls of the model are in flight, so a long generation is not idleness.
Several gateway replicas each stamp the mark; the newest wins.

It never fights an autoscaler: the field is refused (CEL and pydantic) together with `spec.autoscaling`,
so it only ever sets the replica count that the operator itself applies to the Deployment.

The operator checks the services it reconciled (`IdleWatch.track`) every `interval_s` with one `get` each;
no Kopf timer (Kopf would put a finalizer on every object it serves).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from fleetgate.engine.kube_names import ANNOTATION_LAST_REQUEST, ANNOTATION_WAKE_REPLICAS, SPEC_SCALE_TO_ZERO_AFTER

if TYPE_CHECKING:
    from fleetgate.operator.kube import KubeApi

log = logging.getLogger(__name__)


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def idle_patch(body: Mapping[str, Any], *, now: dt.datetime) -> dict[str, Any] | None:
    """The merge patch that scales an idle service to zero, or None (not idle, already at zero, not opted in)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    after = spec.get(SPEC_SCALE_TO_ZERO_AFTER)
    if not isinstance(after, int) or after <= 0 or spec.get("autoscaling") or meta.get("deletionTimestamp"):
        return None
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas <= 0:
        return None
    marks = [_time((meta.get("annotations") or {}).get(ANNOTATION_LAST_REQUEST)), _time(meta.get("creationTimestamp"))]
    last = max((m for m in marks if m is not None), default=None)
    if last is None or (now - last).total_seconds() < after:
        return None
    return {"metadata": {"annotations": {ANNOTATION_WAKE_REPLICAS: str(replicas)}}, "spec": {"replicas": 0}}


class IdleWatch:
    """The InferenceServices that opted into idle scale-down, checked every `interval_s`."""

    def __init__(self, *, api: KubeApi, interval_s: float,
                 paused: Callable[[], Awaitable[bool]] | None = None) -> None:
        """`paused`: whether a peer outranks this operator now; Kopf pauses its handlers then, and this
        background task, which Kopf does not manage, must pause with them."""
        self._api = api
        self._interval_s = interval_s
        self._paused = paused
        self._tracked: set[tuple[str, str]] = set()

    def track(self, body: Mapping[str, Any]) -> None:
        """Called on every reconcile: (un)tracks the service as its spec opts in or out."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if (body.get("spec") or {}).get(SPEC_SCALE_TO_ZERO_AFTER):
            self._tracked.add(key)
        else:
            self._tracked.discard(key)

    async def check(self, *, now: dt.datetime | None = None) -> list[tuple[str, str]]:
        """One pass: scale every idle tracked service to zero; returns those scaled."""
        scaled = []
        for namespace, name in sorted(self._tracked):
            body = await self._api.get_inference_service(namespace=namespace, name=name)
            if body is None:
                self._tracked.discard((namespace, name))
                continue
            patch = idle_patch(body, now=now or dt.datetime.now(dt.UTC))
            if patch is None:
                continue
            message = (f"no request for {body['spec'][SPEC_SCALE_TO_ZERO_AFTER]} s: scaled to zero from "
                       f"{patch['metadata']['annotations'][ANNOTATION_WAKE_REPLICAS]} replicas; "
                       "the next request through the gateway wakes it")
            log.info("%s/%s %s", namespace, name, message)
            await self._api.patch_inference_service(namespace=namespace, name=name, patch=patch)
            await self._api.emit_event(owner=body, event_type="Normal", reason="ScaledToZeroIdle", message=message)
            scaled.append((namespace, name))
        return scaled

    async def tick(self) -> list[tuple[str, str]]:
        """One pass unless a peer outranks this operator (then nothing is scaled)."""
        if self._paused is not None and await self._paused():
            log.info("idle scale-down skipped: a peer operator with a higher or equal priority is active")
            return []
        return await self.check()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.tick()
            except Exception as exc:  # a failed pass is retried at the next interval
                log.warning("idle scale-down pass failed: %s", exc)
