"""One reconcile pass for an InferenceService: validate, plan capacity, apply children, write status.

Level-based: every pass starts from the CR as it is and the children as they are, so a missed event, a
restart or a second pass changes nothing that is already right (children whose spec hash matches are not
written at all). Outcomes, for the Kopf wiring to translate:
- `SpecRejected`: the spec is invalid; status and a Warning Event say why; retrying cannot help.
- `Outcome.waiting`: children applied, engine pods not all ready yet (a normal state: retry later).
- `Outcome.fits is False`: the capacity plan says no; no pods were created; status and an Event say why.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.kube import KubeApi
from fleetgate.operator.plan import POD_KINDS, Action, plan
from fleetgate.operator.resolve import Resolved, resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import InferenceServiceSpec, parse_spec
from fleetgate.operator.status import compute_status


class SpecRejected(Exception):
    """The InferenceService spec is invalid; the message names the fields."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    actions: list[Action]
    status: dict[str, Any]
    fits: bool

    @property
    def waiting(self) -> bool:
        return self.fits and self.status["phase"] in ("Pending", "Progressing")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "spec"
        parts.append(f"spec.{where}: {err.get('msg')}")
    return "; ".join(parts)


def _comparable(previous: dict[str, Any] | None, status: dict[str, Any]) -> dict[str, Any]:
    """The previous status restricted to the keys we write (None for absent), to skip no-op writes."""
    return {key: (previous or {}).get(key) for key in status}


def _condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), {})


class Reconciler:
    def __init__(self, *, api: KubeApi, settings: OperatorSettings, clock: Callable[[], dt.datetime] = _utcnow) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock

    def _child_kinds(self) -> list[str]:
        kinds = ["Service", "Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
        if self._settings.capabilities.keda:
            kinds.append("ScaledObject")
        if self._settings.capabilities.service_monitor:
            kinds.append("ServiceMonitor")
        return kinds

    def _validate(self, body: dict[str, Any], owner: Owner) -> tuple[InferenceServiceSpec, Resolved]:
        try:
            spec = parse_spec(body.get("spec") or {})
            return spec, resolve(spec=spec, name=owner.name, profiles=self._settings.profiles)
        except ValidationError as exc:
            raise SpecRejected(_validation_message(exc)) from None
        except ConfigError as exc:
            raise SpecRejected(str(exc)) from None

    async def reconcile(self, body: dict[str, Any]) -> Outcome:
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
        results = await asyncio.gather(*(self._write(owner, a) for a in writes))
        for action, stored in zip(writes, results, strict=True):
            if action.kind == "Deployment" and stored is not None:
                deployment = stored
        conflicts = tuple(f"{a.kind}/{a.name}" for a in actions if a.verb == "conflict")
        status = await self._write_status(
            owner, spec=spec, resolved=resolved, invalid=None, deployment=deployment, previous=previous,
            conflicts=conflicts,
        )
        await self._announce(body, previous, status)
        return Outcome(actions=actions, status=status, fits=fits)

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
    ) -> dict[str, Any]:
        """Compute status from the children as they are and patch it only when it changed (level-based)."""
        status = compute_status(
            owner=owner, spec=spec, resolved=resolved, invalid=invalid, deployment=deployment, previous=previous,
            now=self._clock(), conflicts=conflicts, cluster_domain=self._settings.cluster_domain,
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
        """Recompute status from the children as they are now (a Deployment changed); writes nothing else."""
        owner = Owner.from_body(body)
        previous = body.get("status")
        try:
            spec, resolved = self._validate(body, owner)
        except SpecRejected:
            return dict(previous or {})
        if deployment is None:
            deployment = await self._api.get_child(kind="Deployment", namespace=owner.namespace, name=owner.name)
        return await self._write_status(
            owner, spec=spec, resolved=resolved, invalid=None, deployment=deployment, previous=previous
        )

    async def _reject(self, body: dict[str, Any], owner: Owner, previous: dict[str, Any] | None, message: str) -> None:
        deployment = await self._api.get_child(kind="Deployment", namespace=owner.namespace, name=owner.name)
        await self._write_status(
            owner, spec=None, resolved=None, invalid=message, deployment=deployment, previous=previous
        )
        before = _condition(previous, "Degraded")
        if not (before.get("reason") == "InvalidSpec" and before.get("message") == message):
            await self._api.emit_event(owner=body, event_type="Warning", reason="InvalidSpec", message=message)

    async def _announce(self, body: dict[str, Any], previous: dict[str, Any] | None, status: dict[str, Any]) -> None:
        """One Event per change of the capacity verdict (not one per pass)."""
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
