"""One reconcile pass for an InferenceService: validate, plan capacity, apply children, write status.

Level-based: every pass starts from the CR as it is and the children as they are, so a missed event, a
restart or a second pass changes nothing that is already right (children whose spec hash matches are not
written at all). Outcomes, for the Kopf wiring to translate:
- `SpecRejected`: the spec is invalid; status and a Warning Event say why; retrying cannot help.
- `Outcome.waiting`: children applied, engine pods not all ready yet (a normal state: retry later).
- `Outcome.fits is False`: the capacity plan says no; no pods were created; status and an Event say why.
- `Outcome.failed`: a child could not be written (the API server refused it); status is Degraded
  (ApplyFailed) and a Warning Event names the child; the Kopf wiring retries later.
- `Outcome.adapter_failures`: a LoRA adapter did not load on a ready pod (`fleetgate.operator.adapters`);
  status (AdaptersReady False, `status.adapters`) and one Warning Event per new failure say which and why;
  the Kopf wiring retries later. Adapters are synced on every pass and every status refresh.
Passes over one InferenceService never overlap (a lock per object), and each starts from the object as
stored, so two triggers of one edit (the update handler and a child's event) announce it once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.operator.adapters import PodAdapterApi, PodAdapters, VllmAdapterApi, failures, new_failures, ready_pods
from fleetgate.operator.adapters import sync_adapters as sync_pod_adapters
from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.kube import KubeApi, status_code
from fleetgate.operator.names import name_problem
from fleetgate.operator.plan import POD_KINDS, Action, plan
from fleetgate.operator.resolve import Resolved, resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import InferenceServiceSpec, parse_spec, validation_message
from fleetgate.operator.status import compute_status

_MAX_ADAPTER_EVENTS = 20  # per pass: a fleet-wide outage must not flood the namespace with Events


class SpecRejected(Exception):
    """The InferenceService spec is invalid; the message names the fields."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    actions: list[Action]
    status: dict[str, Any]
    fits: bool
    failed: tuple[str, ...] = ()
    adapter_failures: tuple[str, ...] = ()

    @property
    def waiting(self) -> bool:
        return self.fits and self.status["phase"] in ("Pending", "Progressing")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _comparable(previous: dict[str, Any] | None, status: dict[str, Any]) -> dict[str, Any]:
    """The previous status restricted to the keys we write (None for absent), to skip no-op writes."""
    return {key: (previous or {}).get(key) for key in status}


def _condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), {})


def _failure(action: Action, exc: Exception) -> str:
    """`Kind/name: what the API server said`, short enough for a condition message."""
    message = str(getattr(getattr(exc, "status", None), "message", "") or exc)
    code = status_code(exc)
    return f"{action.kind}/{action.name}: {f'HTTP {code}: ' if code else ''}{message}"[:300]


class Reconciler:
    def __init__(
        self,
        *,
        api: KubeApi,
        settings: OperatorSettings,
        clock: Callable[[], dt.datetime] = _utcnow,
        adapter_api: PodAdapterApi | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock
        self._adapter_api: PodAdapterApi = adapter_api or VllmAdapterApi()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def aclose(self) -> None:
        await self._adapter_api.aclose()

    async def _sync_adapters(
        self, owner: Owner, *, spec: InferenceServiceSpec, resolved: Resolved
    ) -> list[PodAdapters] | None:
        """Every ready engine pod to spec.adapters, through the pods' runtime API (None: LoRA off, no pods)."""
        if not spec.lora_enabled or (resolved.plan is not None and not resolved.plan.fits):
            return None
        pods = ready_pods(pods=await self._api.list_engine_pods(namespace=owner.namespace, owner_name=owner.name))
        return await sync_pod_adapters(
            api=self._adapter_api, pods=pods, desired=resolved.adapters, served_model=resolved.served_model
        )

    async def _announce_adapters(
        self, body: dict[str, Any], previous: dict[str, Any] | None, adapters: list[PodAdapters] | None
    ) -> None:
        """One Warning Event per adapter that failed on a pod, when the previous status did not show it yet."""
        for message in new_failures(results=adapters or [], previous=previous)[:_MAX_ADAPTER_EVENTS]:
            await self._api.emit_event(owner=body, event_type="Warning", reason="AdapterLoadFailed", message=message)

    def _child_kinds(self) -> list[str]:
        kinds = ["Service", "Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
        if self._settings.capabilities.keda:
            kinds.append("ScaledObject")
        if self._settings.capabilities.service_monitor:
            kinds.append("ServiceMonitor")
        return kinds

    def _validate(self, body: dict[str, Any], owner: Owner) -> tuple[InferenceServiceSpec, Resolved]:
        problem = name_problem(owner.name)
        if problem is not None:
            raise SpecRejected(problem)
        try:
            spec = parse_spec(body.get("spec") or {})
            return spec, resolve(spec=spec, name=owner.name, profiles=self._settings.profiles)
        except ValidationError as exc:
            raise SpecRejected(validation_message(exc)) from None
        except ConfigError as exc:
            raise SpecRejected(str(exc)) from None

    async def reconcile(self, body: dict[str, Any]) -> Outcome:
        """One pass, serialized per object, on the object as stored now (the given body if it is gone)."""
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        async with self._locks.setdefault(key, asyncio.Lock()):
            current = await self._api.get_inference_service(namespace=key[0], name=key[1])
            if current is not None and current.get("metadata", {}).get("uid") == meta.get("uid"):
                body = current
            return await self._reconcile(body)

    async def _reconcile(self, body: dict[str, Any]) -> Outcome:
        owner = Owner.from_body(body)
        previous = body.get("status")
        try:
            spec, resolved = self._validate(body, owner)
        except SpecRejected as exc:
            await self._reject(body, owner, previous, str(exc))
            raise
        desired = build_children(owner=owner, spec=spec, resolved=resolved, settings=self._settings)
        observed = await self._api.list_children(
            namespace=owner.namespace, owner_name=owner.name, kinds=self._child_kinds()
        )
        fits = resolved.plan is None or resolved.plan.fits
        actions = plan(desired=desired, observed=observed, owner_uid=owner.uid, hold=frozenset() if fits else POD_KINDS)
        deployment = next((o for o in observed if o["kind"] == "Deployment"), None)
        # Children are independent objects: apply and delete them concurrently (one round trip, not N).
        writes = [a for a in actions if a.verb in ("create", "update", "delete")]
        results = await asyncio.gather(*(self._write(owner, a) for a in writes), return_exceptions=True)
        failed: list[str] = []
        for action, stored in zip(writes, results, strict=True):
            if isinstance(stored, BaseException):
                if not isinstance(stored, Exception):
                    raise stored
                failed.append(_failure(action, stored))
            elif action.kind == "Deployment" and stored is not None:
                deployment = stored
        conflicts = tuple(f"{a.kind}/{a.name}" for a in actions if a.verb == "conflict")
        status, adapters = await self._sync_and_write(
            owner, spec=spec, resolved=resolved, deployment=deployment, previous=previous, failed=tuple(failed),
            conflicts=conflicts,
        )
        await self._announce(body, previous, status)
        await self._announce_adapters(body, previous, adapters)
        return Outcome(
            actions=actions,
            status=status,
            fits=fits,
            failed=tuple(failed),
            adapter_failures=tuple(failures(results=adapters or [])),
        )

    async def _sync_and_write(
        self,
        owner: Owner,
        *,
        spec: InferenceServiceSpec,
        resolved: Resolved,
        deployment: dict[str, Any] | None,
        previous: dict[str, Any] | None,
        failed: tuple[str, ...],
        conflicts: tuple[str, ...] = (),
    ) -> tuple[dict[str, Any], list[PodAdapters] | None]:
        """Bring the ready pods' adapters in line with the spec, then write the status that says so (both
        reconcile and status refresh end this way)."""
        adapters = await self._sync_adapters(owner, spec=spec, resolved=resolved)
        status = await self._write_status(
            owner, spec=spec, resolved=resolved, invalid=None, deployment=deployment, previous=previous,
            conflicts=conflicts, failed=failed, adapters=adapters,
        )
        return status, adapters

    async def _write_status(
        self,
        owner: Owner,
        *,
        spec: InferenceServiceSpec | None,
        resolved: Resolved | None,
        invalid: str | None,
        deployment: dict[str, Any] | None,
        previous: dict[str, Any] | None,
        conflicts: tuple[str, ...] = (),
        failed: tuple[str, ...] = (),
        adapters: list[PodAdapters] | None = None,
    ) -> dict[str, Any]:
        """Compute status from the children as they are and patch it only when it changed (level-based)."""
        status = compute_status(
            owner=owner,
            spec=spec,
            resolved=resolved,
            invalid=invalid,
            deployment=deployment,
            previous=previous,
            now=self._clock(),
            conflicts=conflicts,
            cluster_domain=self._settings.cluster_domain,
            failed=failed,
            adapters=adapters,
        )
        if status != _comparable(previous, status):
            await self._api.patch_status(namespace=owner.namespace, name=owner.name, status=status)
        return status

    async def _write(self, owner: Owner, action: Action) -> dict[str, Any] | None:
        if action.verb == "delete":
            await self._api.delete_child(kind=action.kind, namespace=owner.namespace, name=action.name)
            return None
        assert action.manifest is not None
        return await self._api.apply(action.manifest)

    async def refresh_status(self, body: dict[str, Any], *, deployment: dict[str, Any] | None = None) -> dict[str, Any]:
        """Recompute status from the children as they are now (a Deployment changed); writes nothing else.

        Only for a spec that a reconcile pass has seen (observedGeneration current): a newer spec is the next
        pass's to plan, announce and write, and waiting for that pass's lock keeps the two from interleaving."""
        meta = body.get("metadata", {})
        async with self._locks.setdefault((meta.get("namespace", ""), meta.get("name", "")), asyncio.Lock()):
            return await self._refresh_status(body, deployment=deployment)

    async def _refresh_status(self, body: dict[str, Any], *, deployment: dict[str, Any] | None) -> dict[str, Any]:
        owner = Owner.from_body(body)
        previous = body.get("status")
        if (previous or {}).get("observedGeneration") != owner.generation:
            return dict(previous or {})
        try:
            spec, resolved = self._validate(body, owner)
        except SpecRejected:
            return dict(previous or {})
        if deployment is None:
            deployment = await self._api.get_child(kind="Deployment", namespace=owner.namespace, name=owner.name)
        # A child refused by the last pass is still missing: only a pass that applies it clears the verdict.
        degraded = _condition(previous, "Degraded")
        failed = (str(degraded.get("message", "")),) if degraded.get("reason") == "ApplyFailed" else ()
        status, adapters = await self._sync_and_write(
            owner, spec=spec, resolved=resolved, deployment=deployment, previous=previous, failed=failed
        )
        await self._announce_adapters(body, previous, adapters)
        return status

    async def _reject(self, body: dict[str, Any], owner: Owner, previous: dict[str, Any] | None, message: str) -> None:
        deployment = await self._api.get_child(kind="Deployment", namespace=owner.namespace, name=owner.name)
        await self._write_status(
            owner, spec=None, resolved=None, invalid=message, deployment=deployment, previous=previous
        )
        before = _condition(previous, "Degraded")
        if not (before.get("reason") == "InvalidSpec" and before.get("message") == message):
            await self._api.emit_event(owner=body, event_type="Warning", reason="InvalidSpec", message=message)

    async def _announce(self, body: dict[str, Any], previous: dict[str, Any] | None, status: dict[str, Any]) -> None:
        """One Event per change of the capacity verdict or of the apply failure (not one per pass)."""
        failed_now = _condition(status, "Degraded")
        failed_before = _condition(previous, "Degraded")
        if failed_now.get("reason") == "ApplyFailed" and (failed_now.get("reason"), failed_now.get("message")) != (
            failed_before.get("reason"),
            failed_before.get("message"),
        ):
            await self._api.emit_event(
                owner=body, event_type="Warning", reason="ApplyFailed", message=failed_now["message"]
            )
        now = _condition(status, "CapacityPlanned")
        before = _condition(previous, "CapacityPlanned")
        if (now.get("reason"), now.get("message")) == (before.get("reason"), before.get("message")):
            return
        if now.get("reason") == "DoesNotFit":
            await self._api.emit_event(owner=body, event_type="Warning", reason="DoesNotFit", message=now["message"])
        elif now.get("reason") == "ConcurrencyLimited":
            await self._api.emit_event(
                owner=body, event_type="Warning", reason="ConcurrencyLimited", message=now["message"]
            )
        elif now.get("reason") == "Fits":
            await self._api.emit_event(
                owner=body, event_type="Normal", reason="CapacityPlanned", message=now["message"]
            )
