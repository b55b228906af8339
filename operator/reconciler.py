"""One reconcile pass for an InferenceService: validate, plan capacity, apply children, write status.

Level-based: every pass starts from the CR as it is and the children as they are, so a missed event, a
restart or a second pass changes nothing that is already right (children whose spec hash matches and whose
owned fields are as applied are not written at all). A child someone edited (`kubectl scale`, `set image`,
`patch svc`) is applied again, and one Warning Event `DriftCorrected` names the fields put back
(`fleetgate.operator.drift`; `child_changed` runs a pass when a child's watch event shows such an edit).
Outcomes, for the Kopf wiring to translate:
- `SpecRejected`: the spec is invalid; status and a Warning Event say why; retrying cannot help.
- `Outcome.waiting`: children applied, engine pods not all ready yet (a normal state: retry later).
- `Outcome.fits is False`: the capacity plan says no; no pods were created; status and an Event say why.
- `Outcome.failed`: a child could not be written (the API server refused it); status is Degraded
  (ApplyFailed) and a Warning Event names the child; the Kopf wiring retries later.
- `Outcome.adapter_failures`: a LoRA adapter did not load on a ready pod (`fleetgate.operator.adapters`);
  status (AdaptersReady False, `status.adapters`) and one Warning Event per new failure say which and why;
  re-checked after `adapter_retry_s` (`fleetgate.operator.resync`). Adapters are synced on every pass and
  every status refresh; engine pods that are not all ready are re-checked every `pod_check_s`, and a pod
  the cluster refuses (`fleetgate.operator.pod_problems`) is Degraded with its reason and one Event.
Passes over one InferenceService never overlap (a lock per object), and each starts from the object as
stored, so two triggers of one edit (the update handler and a child's event) announce it once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.operator.adapters import PodAdapterApi, PodAdapters, VllmAdapterApi, failures, new_failures, ready_pods
from fleetgate.operator.adapters import sync_adapters as sync_pod_adapters
from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.drift import drift
from fleetgate.operator.kube import KubeApi, status_code
from fleetgate.operator.names import name_problem
from fleetgate.operator.observe import Observed, observe, recheck_after
from fleetgate.operator.plan import UNFIT_HOLD, Action, owned_by, plan, spec_hash_of
from fleetgate.operator.resolve import Resolved, resolve
from fleetgate.operator.resync import Key, Resync
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.shared_names import shared_with
from fleetgate.operator.spec import InferenceServiceSpec, parse_spec, validation_message
from fleetgate.operator.status import compute_status

_MAX_ADAPTER_EVENTS = 20  # per pass: a fleet-wide outage must not flood the namespace with Events
# Degraded reasons announced by an Event of their own elsewhere (InvalidSpec, DoesNotFit) or not at all;
# every other Degraded reason (ApplyFailed, a pod problem, ...) gets one Warning Event per change.
_EVENT_QUIET = frozenset({"InvalidSpec", "DoesNotFit"})


class SpecRejected(Exception):
    """The InferenceService spec is invalid; the message names the fields."""


class DriftNotCorrected(Exception):
    """Edited fields that read back changed even after apply and merge patch: something on the write path
    (a mutating admission webhook, a policy engine) sets them. Announced once, then left alone: fighting it
    would rewrite the child on every watch event."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        super().__init__(", ".join(fields))
        self.fields = fields


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
        paused: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """`paused`: whether a peer operator outranks this one now (re-checks are skipped then)."""
        self._api = api
        self._settings = settings
        self._clock = clock
        self._adapter_api: PodAdapterApi = adapter_api or VllmAdapterApi()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._resync = Resync(run=self._recheck, paused=paused, retry_s=settings.retry_failed_s)
        # (namespace, kind, name) -> edited fields a restore could not put back (see DriftNotCorrected).
        self._unfixable: dict[tuple[str, str, str], frozenset[str]] = {}

    async def aclose(self) -> None:
        await self._resync.aclose()
        await self._adapter_api.aclose()

    async def _recheck(self, key: Key) -> None:
        body = await self._api.get_inference_service(namespace=key[0], name=key[1])
        if body is not None and not body.get("metadata", {}).get("deletionTimestamp"):
            await self.refresh_status(body)

    async def _sync_adapters(
        self, *, spec: InferenceServiceSpec, resolved: Resolved, pods: list[dict[str, Any]]
    ) -> list[PodAdapters] | None:
        """Every ready engine pod to spec.adapters, through the pods' runtime API (None: LoRA off, no pods)."""
        if not spec.lora_enabled or (resolved.plan is not None and not resolved.plan.fits):
            return None
        return await sync_pod_adapters(
            api=self._adapter_api, pods=ready_pods(pods=pods), desired=resolved.adapters,
            served_model=resolved.served_model,
        )  # fmt: skip

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
        hold = frozenset() if fits else UNFIT_HOLD
        actions = plan(desired=desired, observed=observed, owner_uid=owner.uid, hold=hold)
        deployment = next((o for o in observed if o["kind"] == "Deployment"), None)
        # Children are independent objects: apply and delete them concurrently (one round trip, not N).
        writes = [a for a in actions if a.verb in ("create", "update", "delete")]
        results = await asyncio.gather(*(self._write(owner, a) for a in writes), return_exceptions=True)
        failed: list[str] = []
        corrected: list[str] = []
        for action, stored in zip(writes, results, strict=True):
            if isinstance(stored, DriftNotCorrected):
                await self._drift_not_corrected(body, action, stored)
                continue
            if isinstance(stored, BaseException):
                if not isinstance(stored, Exception):
                    raise stored
                failed.append(_failure(action, stored))
                continue
            self._unfixable.pop((owner.namespace, action.kind, action.name), None)
            if action.drift:
                corrected.append(f"{action.kind} {action.name}: put back {', '.join(action.drift)}")
            if action.kind == "Deployment" and stored is not None:
                deployment = stored
        conflicts = tuple(f"{a.kind}/{a.name}" for a in actions if a.verb == "conflict")
        others = await self._api.list_inference_services(namespace=owner.namespace)
        shared = shared_with(name=owner.name, served=resolved.served_model, source=spec.model.source, others=others)
        status, adapters = await self._sync_and_write(
            owner, spec=spec, resolved=resolved, deployment=deployment, previous=previous, failed=tuple(failed),
            conflicts=conflicts, children=observed, shared=shared,
        )
        for message in corrected:
            await self._api.emit_event(owner=body, event_type="Warning", reason="DriftCorrected", message=message)
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
        children: list[dict[str, Any]] | None = None,
        shared: tuple[str, ...] | None = None,
    ) -> tuple[dict[str, Any], list[PodAdapters] | None]:
        """Bring the ready pods' adapters in line with the spec, then write the status that says so, and ask
        for a re-check if something is still pending (both reconcile and status refresh end this way)."""
        seen = await observe(
            api=self._api, owner=owner, spec=spec, resolved=resolved, settings=self._settings,
            deployment=deployment, children=children,
        )  # fmt: skip
        adapters = await self._sync_adapters(spec=spec, resolved=resolved, pods=seen.pods)
        status = await self._write_status(
            owner, spec=spec, resolved=resolved, invalid=None, deployment=deployment, previous=previous,
            conflicts=conflicts, failed=failed, adapters=adapters, seen=seen, shared=shared,
        )
        after = recheck_after(
            settings=self._settings, spec=spec, resolved=resolved, deployment=deployment, adapters=adapters
        )
        if after is not None:
            self._resync.schedule((owner.namespace, owner.name), after_s=after)
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
        seen: Observed | None = None,
        shared: tuple[str, ...] | None = None,
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
            pod_problem=seen.problem if seen is not None else None,
            autoscaler=seen.autoscaler if seen is not None else None,
            shared_with=shared,
        )
        if status != _comparable(previous, status):
            await self._api.patch_status(namespace=owner.namespace, name=owner.name, status=status)
        return status

    async def _write(self, owner: Owner, action: Action) -> dict[str, Any] | None:
        if action.verb == "delete":
            await self._api.delete_child(kind=action.kind, namespace=owner.namespace, name=action.name)
            return None
        assert action.manifest is not None
        if action.drift:
            return await self._restore(action.manifest)
        return await self._api.apply(action.manifest)

    async def _restore(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Put back what someone edited. Server-side apply first; where the API server refuses it or it leaves
        the edit (another manager now owns a list item that apply cannot remove: after `kubectl patch
        --type=json` changed a Service's port, the applied port and the edited one share the name `http`,
        422 Duplicate value), a merge patch replaces the owned lists whole, and a second apply takes the
        fields back under the operator's field manager."""
        try:
            stored = await self._api.apply(manifest)
            if not drift(desired=manifest, live=stored):
                return stored
        except Exception as exc:
            if status_code(exc) in (401, 403, 404):
                raise  # not something a different patch fixes
        await self._api.merge_patch(manifest)
        stored = await self._api.apply(manifest)
        left = drift(desired=manifest, live=stored)
        if left:
            raise DriftNotCorrected(tuple(d.describe() for d in left))
        return stored

    async def _drift_not_corrected(self, body: dict[str, Any], action: Action, exc: DriftNotCorrected) -> None:
        key = (body["metadata"]["namespace"], action.kind, action.name)
        if self._unfixable.get(key) == frozenset(exc.fields):
            return
        self._unfixable[key] = frozenset(exc.fields)
        message = (
            f"{action.kind} {action.name}: {exc} still differ after apply and merge patch; something on the write "
            "path (a mutating admission webhook or policy) sets them, so they are left as they are"
        )
        await self._api.emit_event(owner=body, event_type="Warning", reason="DriftNotCorrected", message=message)

    async def child_changed(self, body: dict[str, Any], *, child: dict[str, Any]) -> None:
        """A child's watch event (not its deletion): a full pass when the child is not as applied (someone
        edited an owned field, or it is owned but no longer wanted), else a status refresh when the child
        feeds status (Deployment, HPA). Our own writes come back as events too and find nothing to do."""
        if self._edited(body, child):
            await self.reconcile(body)
        elif child.get("kind") in ("Deployment", "HorizontalPodAutoscaler"):
            await self.refresh_status(body)

    def _edited(self, body: dict[str, Any], child: dict[str, Any]) -> bool:
        owner = Owner.from_body(body)
        if not owned_by(child, uid=owner.uid):
            return False
        try:
            spec, resolved = self._validate(body, owner)
        except SpecRejected:
            return False
        if not (resolved.plan is None or resolved.plan.fits) and child.get("kind") in UNFIT_HOLD:
            return False  # held as it is while the spec does not fit
        key = (child.get("kind"), (child.get("metadata") or {}).get("name"))
        desired = build_children(owner=owner, spec=spec, resolved=resolved, settings=self._settings)
        manifest = next((d for d in desired if (d["kind"], d["metadata"]["name"]) == key), None)
        if manifest is None:
            return True
        if spec_hash_of(child) != spec_hash_of(manifest):
            return True
        edited = frozenset(d.describe() for d in drift(desired=manifest, live=child))
        return bool(edited) and edited != self._unfixable.get((owner.namespace, str(key[0]), str(key[1])))

    async def refresh_status(self, body: dict[str, Any]) -> dict[str, Any]:
        """Recompute status from the children as they are now (a Deployment changed); writes nothing else.

        Only for a spec that a reconcile pass has seen (observedGeneration current): a newer spec is the next
        pass's to plan, announce and write, and waiting for that pass's lock keeps the two from interleaving.
        The object and its Deployment are read under that lock, not taken from the watch event that asked:
        an event handled late carries an older Deployment, and the status would flip back and forth."""
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        async with self._locks.setdefault(key, asyncio.Lock()):
            # As stored now: a pass that held the lock may have written status (and announced it) meanwhile.
            current = await self._api.get_inference_service(namespace=key[0], name=key[1])
            if current is None or current.get("metadata", {}).get("uid") != meta.get("uid"):
                return dict(body.get("status") or {})
            return await self._refresh_status(current)

    async def _refresh_status(self, body: dict[str, Any]) -> dict[str, Any]:
        owner = Owner.from_body(body)
        previous = body.get("status")
        if (previous or {}).get("observedGeneration") != owner.generation:
            return dict(previous or {})
        try:
            spec, resolved = self._validate(body, owner)
        except SpecRejected:
            return dict(previous or {})
        deployment = await self._api.get_child(kind="Deployment", namespace=owner.namespace, name=owner.name)
        # A child refused by the last pass is still missing: only a pass that applies it clears the verdict.
        degraded = _condition(previous, "Degraded")
        failed = (str(degraded.get("message", "")),) if degraded.get("reason") == "ApplyFailed" else ()
        status, adapters = await self._sync_and_write(
            owner, spec=spec, resolved=resolved, deployment=deployment, previous=previous, failed=failed
        )
        await self._announce(body, previous, status)
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
        """One Event per change of the capacity verdict, of an apply failure or pod problem, or of an autoscaler
        failure (not one per pass)."""
        for type_, bad in (("Degraded", "True"), ("AutoscalerActive", "False"), ("ServedModelUnique", "False")):
            now, before = _condition(status, type_), _condition(previous, type_)
            changed = (now.get("reason"), now.get("message")) != (before.get("reason"), before.get("message"))
            if changed and now.get("status") == bad and now.get("reason") not in _EVENT_QUIET:
                await self._api.emit_event(
                    owner=body, event_type="Warning", reason=str(now["reason"]), message=str(now.get("message", ""))
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
