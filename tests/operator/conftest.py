"""A running operator against kmock, an in-process Kubernetes API (see fleetgate.operator.apisim for what
it emulates and what it does not: no garbage collection, admission or defaulting)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest
from kmock._internal import apps

from fleetgate.core.adapters import LoadedAdapter
from fleetgate.engine.lora_api import AdapterApiError
from fleetgate.operator.apisim import new_emulator
from fleetgate.operator.embedded import EmbeddedOperator, running_operator
from fleetgate.operator.handlers import register
from fleetgate.operator.kube import KubeApi, resource_class
from fleetgate.operator.settings import OperatorSettings


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

    async def add_pod(self, owner: str, name: str, *, ip: str, ready: bool = True, namespace: str = "default") -> None:
        """An engine pod of `owner` as the kubelet would report it (kmock runs no pods)."""
        from lightkube.resources.core_v1 import Pod

        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "fleetgate-engine", "app.kubernetes.io/instance": owner}},
            "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }  # fmt: skip
        await self.api._client.create(Pod.from_dict(body))

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


@dataclass
class FakePods:
    """The engine pods' runtime LoRA API, faked: loaded adapters per pod URL and every call made.

    The operator calls it from its own thread while the test reads and edits it: each access is one
    dict/list/set operation (atomic under the GIL), and `loaded` copies before it builds its answer."""

    served: str = "qwen"
    held: dict[str, dict[str, str]] = field(default_factory=dict)  # url -> adapter name -> source
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, url, adapter)
    fail_load: dict[str, str] = field(default_factory=dict)  # adapter name -> the engine's refusal
    unreachable: set[str] = field(default_factory=set)  # urls that do not answer

    async def loaded(self, *, base_url: str) -> list[LoadedAdapter]:
        if base_url in self.unreachable:
            raise AdapterApiError(f"ClientConnectorError calling {base_url}/v1/models")
        items = list(self.held.get(base_url, {}).items())
        return [LoadedAdapter(name=name, base=self.served, source=source) for name, source in items]

    async def load(self, *, base_url: str, name: str, source: str) -> None:
        self.calls.append(("load", base_url, name))
        if name in self.fail_load:
            raise AdapterApiError(f"loading adapter {name!r} failed: HTTP 400: {self.fail_load[name]}", status=400)
        self.held.setdefault(base_url, {})[name] = source

    async def unload(self, *, base_url: str, name: str) -> None:
        self.calls.append(("unload", base_url, name))
        self.held.get(base_url, {}).pop(name, None)

    async def aclose(self) -> None:
        return None

    def called(self, verb: str) -> set[tuple[str, str]]:
        return {(url, name) for v, url, name in self.calls if v == verb}


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


@contextlib.asynccontextmanager
async def serving(server: Any) -> AsyncIterator[Cluster]:
    """An emulator served on loopback, with a client for the test itself."""
    async with server, apps.Server(server):
        url = str(server.url).rstrip("/")
        api = KubeApi.from_server(url=url, field_manager="test")
        try:
            yield Cluster(server=server, url=url, api=api)
        finally:
            await api.aclose()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with serving(new_emulator()) as served:
        yield served


def operator_registry(
    cluster: Cluster, *, settings: OperatorSettings | None = None, pods: FakePods | None = None
) -> kopf.OperatorRegistry:
    """Our handlers, talking to `cluster` (and to `pods` as the engines' LoRA API, where given)."""
    registry = kopf.OperatorRegistry()
    register(
        registry=registry,
        settings=settings or OperatorSettings(),
        make_api=lambda: KubeApi.from_server(url=cluster.url, field_manager="fleetgate-operator"),
        login=lambda **_: kopf.ConnectionInfo(server=cluster.url, insecure=True),
        make_adapter_api=None if pods is None else lambda: pods,
    )
    return registry


@pytest.fixture
def operator_settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture
def pods() -> FakePods:
    return FakePods()


@pytest.fixture
async def operator(
    cluster: Cluster, operator_settings: OperatorSettings, pods: FakePods
) -> AsyncIterator[EmbeddedOperator]:
    """The real operator (Kopf + handlers + reconciler), standalone, cluster-wide, in a thread and event loop
    of its own (see fleetgate.operator.embedded: in this loop Kopf would take the test's tasks for its own)."""
    registry = operator_registry(cluster, settings=operator_settings, pods=pods)
    async with running_operator(
        registry=registry, clusterwide=True, standalone=True, memo=kopf.Memo(), ready_within=20, stop_within=10
    ) as running:
        yield running
