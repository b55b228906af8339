"""A running operator against a Kubernetes API: kmock (always), or a real API server (envtest) when available.

kmock's emulator stores objects as plain JSON and merges patches; three API-server behaviours the operator
relies on are added here, and only here: server-side apply creates a missing object, `generateName` gets a
suffix, and `metadata.generation` grows when the spec changes. Garbage collection through owner references
is not emulated (the real-API-server suite covers it where one can be had).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kmock
import kopf
import pytest
from kmock._internal import apps, enums

from fleetgate.operator.handlers import register
from fleetgate.operator.kube import KubeApi, resource_class
from fleetgate.operator.settings import OperatorSettings

RESOURCES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    # "group/version/plural": (kind, namespaced, subresources)
    "fleetgate.io/v1alpha1/inferenceservices": ("InferenceService", True, ("status", "scale")),
    "apps/v1/deployments": ("Deployment", True, ("status", "scale")),
    "v1/services": ("Service", True, ("status",)),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, ("status",)),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True, ("status",)),
    "v1/events": ("Event", True, ()),
    "v1/namespaces": ("Namespace", False, ()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, ()),
}


class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus SSA-creates, generateName and generation bumps (see the module docstring)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._names = itertools.count()

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {}) if request.data else {}
            if request.action == enums.action.CREATE and not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._names):05d}"
            if request.action == enums.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
            is_apply = "apply-patch" in (request.headers.get("Content-Type") or "")
            if request.action == enums.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                async with self._lock:
                    exists = key in self._objects and not self._objects[key].deleted
                    if not exists and is_apply:
                        body = dict(request.data)
                        body["metadata"] = {**meta, "uid": str(uuid.uuid4()), "generation": 1}
                        self._objects[key] = body
                        await self._buses[request.resource].put({"type": "ADDED", "object": body})
                    elif exists and "spec" in request.data and not request.url.path.endswith("/status"):
                        current = self._objects[key].raw
                        if current.get("spec") != {**current.get("spec", {}), **request.data["spec"]}:
                            gen = int(current.get("metadata", {}).get("generation") or 1) + 1
                            request.data.setdefault("metadata", {})["generation"] = gen
        return await super()._handle(request)


@dataclass
class Cluster:
    server: Any  # the emulator: .objects, iteration over requests
    url: str
    api: KubeApi  # a client for the test itself (creating CRs, faking the deployment controller)

    def objects(self, plural: str, namespace: str = "default") -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for (resource, ns, name), obj in self.server.objects.items():
            if resource.plural == plural and ns == namespace and not obj.deleted:
                out[name] = obj.raw
        return out

    async def create(self, body: dict[str, Any]) -> None:
        cls = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
        await self.api._client.create(cls.from_dict(body))

    async def patch_spec(self, name: str, spec: dict[str, Any], namespace: str = "default") -> None:
        from lightkube.types import PatchType

        cls = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
        await self.api._client.patch(cls, name, {"spec": spec}, namespace=namespace, patch_type=PatchType.MERGE)

    async def delete(self, name: str, namespace: str = "default") -> None:
        cls = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
        await self.api._client.delete(cls, name, namespace=namespace)

    async def fake_rollout(self, name: str, *, ready: int, namespace: str = "default") -> None:
        """Play the Deployment controller: report `ready` pods of the current generation."""
        from lightkube.types import PatchType

        dep = self.objects("deployments", namespace)[name]
        status = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": ready,
            "readyReplicas": ready,
            "updatedReplicas": ready,
            "availableReplicas": ready,
        }
        cls = resource_class("apps", "v1", "Deployment", "deployments")
        await self.api._client.patch(
            cls.Status, name, {"status": status}, namespace=namespace, patch_type=PatchType.MERGE
        )


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], *, within: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    server = ApiServerEmulator()
    for path, (kind, namespaced, subresources) in RESOURCES.items():
        server.resources[path] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            subresources=subresources,
            verbs={"list", "watch", "get", "create", "patch", "delete"},
        )
    async with server, apps.Server(server):
        url = str(server.url).rstrip("/")
        api = KubeApi.from_server(url=url, field_manager="test")
        try:
            yield Cluster(server=server, url=url, api=api)
        finally:
            await api.aclose()


@pytest.fixture
def operator_settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture
async def operator(cluster: Cluster, operator_settings: OperatorSettings) -> AsyncIterator[asyncio.Task[None]]:
    """The real operator (Kopf + handlers + reconciler) in this event loop, standalone, cluster-wide."""
    registry = kopf.OperatorRegistry()

    def login(**_: Any) -> Any:
        return kopf.ConnectionInfo(server=cluster.url, insecure=True)

    register(
        registry=registry,
        settings=operator_settings,
        make_api=lambda: KubeApi.from_server(url=cluster.url, field_manager="fleetgate-operator"),
        login=login,
    )
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=ready,
            memo=kopf.Memo(),
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=20)
    try:
        yield task
    finally:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)
        assert not task.done() or task.cancelled() or task.exception() is None, "the operator crashed"
