"""InferencePools for InferenceServices: published when the CRD exists, withdrawn when the service goes.

With `OperatorSettings.epp_service` set, every reconcile pass of an InferenceService also applies its pool
(`builders.inferencepool`: the engine pods' selector and port, `endpointPickerRef` to the Endpoint Picker
Service, server-side apply with the operator's field manager). What happened is written to
`status.inferencePool` (a key of its own: the reconciler's merge patches never touch it) as
`{name, phase, message}`:
- `Published`: applied, and the picker Service exists in the namespace;
- `EndpointPickerMissing`: applied, but no Service `epp_service` in the namespace (the reference has no
  namespace, so gateways will report the pool's ResolvedRefs as False until one exists there);
- `CRDAbsent`: the cluster has no InferencePool API (`inference.networking.k8s.io/v1`); nothing is created.
  Every pass checks again, and the sweep publishes the waiting services' pools once the CRD is installed;
- `Failed`: the API server refused the pool (a Warning Event says why; the Kopf wiring retries).
Without `epp_service` nothing is published and no status is written.

Ownership follows the GIE implementer guide: no ownerReference, so the garbage collector never deletes a pool.
The operator does, for pools whose `fleetgate.io/published-for-uid` annotation names the deleted service:
on the service's DELETED watch event (`withdraw`), and in a sweep every `pool_sweep_s` over the namespaces it
has published in (`sweep`: a deletion missed while the operator was down). A pool without that annotation,
or annotated for a service that still exists, is never touched.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleetgate.engine.kube_names import POOL_CRD, POOL_GROUP, POOL_VERSION
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.builders.inferencepool import (
    ANNOTATION_PUBLISHED_UID,
    EndpointPicker,
    build_inference_pool,
)
from fleetgate.operator.kube import KubeApi, status_code
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec, served_name

log = logging.getLogger("fleetgate.operator.pools")
STATUS_KEY = "inferencePool"


@dataclass(frozen=True, kw_only=True)
class PoolStatus:
    name: str
    phase: str  # Published | EndpointPickerMissing | CRDAbsent | Failed
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "phase": self.phase, "message": self.message}


class PoolPublisher:
    def __init__(self, *, api: KubeApi, settings: OperatorSettings) -> None:
        self._api = api
        self._settings = settings
        self._namespaces: set[str] = set()
        self._waiting: set[tuple[str, str]] = set()  # services told CRDAbsent: published by the sweep once it exists

    @property
    def enabled(self) -> bool:
        return self._settings.epp_service is not None

    def _picker(self) -> EndpointPicker:
        assert self._settings.epp_service is not None
        return EndpointPicker(service=self._settings.epp_service, port=self._settings.epp_port,
                              failure_mode=self._settings.epp_failure_mode)

    async def publish(self, body: dict[str, Any]) -> PoolStatus | None:
        """Apply the service's pool and write what happened to `status.inferencePool`; None when publishing is
        off or the spec is invalid (the reconciler reports that)."""
        if not self.enabled or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        owner = Owner.from_body(body)
        try:
            spec = parse_spec(body.get("spec") or {})
            served = served_name(spec=spec, name=owner.name)
        except (ValidationError, ValueError):
            return None
        picker = self._picker()
        kv = spec.engine.kv_events
        manifest = build_inference_pool(owner=owner, served_model=served, picker=picker,
                                        kv_events_topic=kv.topic if kv is not None else None)
        where = f"{owner.namespace}/{owner.name}"
        absent = PoolStatus(name=owner.name, phase="CRDAbsent", message=(
            f"the InferencePool API ({POOL_GROUP}/{POOL_VERSION}) is not installed in this cluster: no pool "
            "published, so Gateway API inference gateways cannot route to this service (install the Gateway API "
            "Inference Extension CRDs; the next reconcile publishes it)"))
        if not await self._api.crd_exists(name=POOL_CRD):  # asked every pass: a CRD installed later is seen
            self._waiting.add((owner.namespace, owner.name))
            await self._write(body, absent)
            return absent
        self._waiting.discard((owner.namespace, owner.name))
        try:
            await self._api.apply(manifest)
        except Exception as exc:
            code = status_code(exc)
            if code == 404:  # the CRD went away since the check
                status = absent
            else:
                message = str(getattr(getattr(exc, "status", None), "message", "") or exc)[:300]
                status = PoolStatus(name=owner.name, phase="Failed",
                                    message=f"InferencePool {where}: {f'HTTP {code}: ' if code else ''}{message}")
            await self._write(body, status)
            return status
        self._namespaces.add(owner.namespace)
        service = await self._api.get_child(kind="Service", namespace=owner.namespace, name=picker.service)
        ref = f"endpointPickerRef {picker.service}:{picker.port}, {picker.failure_mode}"
        if service is None:
            status = PoolStatus(name=owner.name, phase="EndpointPickerMissing", message=(
                f"InferencePool {where} published ({ref}), but there is no Service {picker.service!r} in namespace "
                f"{owner.namespace!r}: gateways cannot reach the picker until one exists there"))
        else:
            status = PoolStatus(name=owner.name, phase="Published",
                                message=f"InferencePool {where} published for model {served!r} ({ref})")
        await self._write(body, status)
        return status

    async def _write(self, body: dict[str, Any], status: PoolStatus) -> None:
        """Patch `status.inferencePool` when it changed; an Event when a failure is new."""
        previous = (body.get("status") or {}).get(STATUS_KEY)
        if previous == status.as_dict():
            return
        meta = body["metadata"]
        await self._api.patch_status(namespace=meta["namespace"], name=meta["name"],
                                     status={STATUS_KEY: status.as_dict()})
        if status.phase == "Failed":
            await self._api.emit_event(owner=body, event_type="Warning", reason="InferencePoolFailed",
                                       message=status.message)

    async def withdraw(self, body: dict[str, Any]) -> bool:
        """The service is gone: delete the pool published for it (only for this very object, by uid)."""
        if not self.enabled:
            return False
        meta = body.get("metadata", {})
        self._waiting.discard((meta.get("namespace", ""), meta.get("name", "")))
        return await self._delete_if_ours(namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                                          uid=meta.get("uid", ""))

    async def _delete_if_ours(self, *, namespace: str, name: str, uid: str) -> bool:
        try:
            pool = await self._api.get_child(kind="InferencePool", namespace=namespace, name=name)
        except Exception as exc:
            if status_code(exc) == 404:  # no CRD: nothing was ever published
                return False
            raise
        if pool is None or not uid or (pool.get("metadata", {}).get("annotations") or {}).get(
                ANNOTATION_PUBLISHED_UID) != uid:
            return False
        await self._api.delete_child(kind="InferencePool", namespace=namespace, name=name)
        log.info("deleted InferencePool %s/%s: its InferenceService is gone", namespace, name)
        return True

    async def sweep(self) -> list[str]:
        """Publish the pools of services that were waiting for the CRD, once it exists; delete pools this operator
        published whose InferenceService no longer exists (or is another object of the same name). Returns
        `namespace/name` of each pool deleted."""
        if not self.enabled:
            return []
        if self._waiting and await self._api.crd_exists(name=POOL_CRD):
            for namespace, name in sorted(self._waiting):
                current = await self._api.get_inference_service(namespace=namespace, name=name)
                self._waiting.discard((namespace, name))
                if current is not None:
                    await self.publish(current)
        if not self._namespaces:
            return []
        deleted = []
        pools = [p for ns in sorted(self._namespaces) for p in await self._api.list_inference_pools(namespace=ns)]
        for pool in pools:
            meta = pool.get("metadata") or {}
            namespace, name = meta.get("namespace", ""), meta.get("name", "")
            uid = (meta.get("annotations") or {}).get(ANNOTATION_PUBLISHED_UID)
            if not uid:
                continue
            current = await self._api.get_inference_service(namespace=namespace, name=name)
            if current is not None and current.get("metadata", {}).get("uid") == uid:
                continue
            if await self._delete_if_ours(namespace=namespace, name=name, uid=uid):
                deleted.append(f"{namespace}/{name}")
        return deleted

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.pool_sweep_s)
            try:
                await self.sweep()
            except Exception as exc:  # the sweep retries next period; the DELETED events do most of the work
                log.warning("InferencePool sweep failed: %s", exc)
