"""The operator, run in this process, against a whole cluster (KUBECONFIG): admission, the ReplicaSet and
Deployment controllers, the scheduler and kubelets answer, not a test playing them.

What only a cluster shows: engine pods admitted by PodSecurity `restricted` and the refusal of a root
override surfaced as Degraded/FailedCreate; a pod the scheduler cannot place (a missing PVC) surfaced as
FailedScheduling naming the claim; `kubectl scale` of a Deployment put back while the Deployment
controller works on it. With hollow nodes (kubemark: pods turn Ready without running a container) also the
LoRA retry: an adapter that failed because no engine answered at the pod is loaded once one answers, with no
edit to anything (the engines' adapter API is faked in-process, so no pod IP needs to be reachable).

Each test works in a namespace of its own, deleted at the end. Skipped, with the reason, without KUBECONFIG
or a reachable cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest

from fleetgate.operator.embedded import running_operator
from fleetgate.operator.handlers import register
from fleetgate.operator.kube import KubeApi, resource_class
from fleetgate.operator.settings import OperatorSettings

from .conftest import FakePods

pytestmark = [
    pytest.mark.kube,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="not run: KUBECONFIG is not set (cluster tier)"),
]
SMALL = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"},
         "resources": {"accelerator": "nvidia-l4", "gpus": 1}}  # fmt: skip
ISVC = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")


class Lab:
    def __init__(self, api: KubeApi, namespace: str, pods: FakePods) -> None:
        self.api, self.namespace, self.pods = api, namespace, pods

    async def create(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": name, "namespace": self.namespace}, "spec": spec}  # fmt: skip
        await self.api._client.create(ISVC.from_dict(body))

    async def condition(self, name: str, type_: str) -> dict[str, Any]:
        body = await self.api.get_inference_service(namespace=self.namespace, name=name) or {}
        return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    async def events(self, name: str, reason: str) -> list[str]:
        from lightkube.resources.core_v1 import Event

        fields = {"involvedObject.name": name, "involvedObject.kind": "InferenceService"}
        listed = self.api._client.list(Event, namespace=self.namespace, fields=fields)
        return [str(e.message) async for e in listed if e.reason == reason]

    async def until(self, check: Any, *, within: float, what: str) -> float:
        t0 = time.monotonic()
        while not await check():
            assert time.monotonic() - t0 < within, f"{what}: not within {within} s"
            await asyncio.sleep(0.2)
        return time.monotonic() - t0


async def _hollow(api: KubeApi) -> bool:
    from lightkube.resources.core_v1 import Node

    nodes = [n async for n in api._client.list(Node)]
    return bool(nodes) and all(
        n.status is not None and n.status.nodeInfo is not None
        and n.status.nodeInfo.containerRuntimeVersion.startswith("fakeRuntime") for n in nodes
    )  # fmt: skip


@pytest.fixture
async def lab(request: pytest.FixtureRequest) -> AsyncIterator[Lab]:
    from lightkube.resources.core_v1 import Namespace

    api = KubeApi.from_env(field_manager="fleetgate-cluster-test")
    try:
        await api._client.get(Namespace, "default")
    except Exception as exc:
        await api.aclose()
        pytest.skip(f"not run: KUBECONFIG names no reachable cluster ({exc})")
    labels = getattr(request, "param", None) or {}
    namespace = f"fg-op-{uuid.uuid4().hex[:6]}"
    await api._client.create(Namespace.from_dict({"metadata": {"name": namespace, "labels": labels}}))
    pods = FakePods(served="qwen2.5-7b-instruct")
    registry = kopf.OperatorRegistry()
    settings = OperatorSettings(adapter_retry_s=2.0, pod_check_s=2.0)
    register(registry=registry, settings=settings, login=kopf.login_with_kubeconfig, make_adapter_api=lambda: pods,
             make_api=lambda: KubeApi.from_env(field_manager="fleetgate-operator"))  # fmt: skip
    try:
        async with running_operator(registry=registry, clusterwide=False, namespaces=[namespace], standalone=True,
                                    memo=kopf.Memo(), ready_within=60, stop_within=15):  # fmt: skip
            yield Lab(api, namespace, pods)
    finally:
        with contextlib.suppress(Exception):
            await api._client.delete(Namespace, namespace)
        await api.aclose()


RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@pytest.mark.parametrize("lab", [RESTRICTED], indirect=True, ids=["restricted-namespace"])
async def test_restricted_namespace_admits_default_pods_and_names_the_refusal_of_root(lab: Lab) -> None:
    from lightkube.resources.core_v1 import Pod

    await lab.create("safe", SMALL)
    await lab.create("rooted", {**SMALL, "pod": {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}})

    async def admitted() -> bool:
        return bool([p async for p in lab.api._client.list(Pod, namespace=lab.namespace,
                                                           labels={"app.kubernetes.io/instance": "safe"})])  # fmt: skip

    await lab.until(admitted, within=60, what="an engine pod of the default template admitted")

    async def refused() -> bool:
        return (await lab.condition("rooted", "Degraded")).get("reason") == "FailedCreate"

    await lab.until(refused, within=60, what="Degraded FailedCreate")
    message = (await lab.condition("rooted", "Degraded"))["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and "runAsUser=0" in message
    await asyncio.sleep(5)  # more re-checks: still one Event
    assert len(await lab.events("rooted", "FailedCreate")) == 1


async def test_a_pod_the_scheduler_cannot_place_names_the_missing_claim(lab: Lab) -> None:
    spec = {**SMALL, "adapters": [{"name": "sql", "source": "pvc://lora-adapters/sql"}]}
    await lab.create("claim", spec)

    async def named() -> bool:
        return (await lab.condition("claim", "Degraded")).get("reason") == "FailedScheduling"

    await lab.until(named, within=60, what="Degraded FailedScheduling")
    assert 'persistentvolumeclaim "lora-adapters" not found' in (await lab.condition("claim", "Degraded"))["message"]
    assert len(await lab.events("claim", "FailedScheduling")) == 1


async def test_kubectl_scale_is_put_back_while_the_deployment_controller_works(lab: Lab) -> None:
    from lightkube.resources.apps_v1 import Deployment

    await lab.create("scaled", SMALL)

    async def exists() -> bool:
        return await lab.api.get_child(kind="Deployment", namespace=lab.namespace, name="scaled") is not None

    await lab.until(exists, within=30, what="Deployment")
    await lab.api._client.patch(Deployment, "scaled", {"spec": {"replicas": 3}}, namespace=lab.namespace)

    async def back() -> bool:
        dep = await lab.api.get_child(kind="Deployment", namespace=lab.namespace, name="scaled") or {}
        return bool(dep["spec"]["replicas"] == 1)

    took = await lab.until(back, within=5, what="replicas put back")
    print(f"cluster: kubectl scale put back in {took:.2f} s")
    await asyncio.sleep(2)
    assert await lab.events("scaled", "DriftCorrected") == ["Deployment scaled: put back spec.replicas (was 3)"]


async def test_a_lora_load_that_failed_is_retried_once_the_engine_answers(lab: Lab) -> None:
    if not await _hollow(lab.api):
        pytest.skip("not run: needs hollow nodes (engine pods Ready without a vLLM image); the kmock tier covers it")
    lab.pods.unreachable.add("http://192.168.192.168:8000")  # the hollow pods' address: no engine there yet
    lab.pods.served = "gemma-3-270m"
    spec = {"model": {"source": "/opt/models/gemma-3-270m-bfloat16", "servedName": "gemma-3-270m"},
            "engine": {"maxModelLen": 2048, "maxAdapters": 1}, "resources": {"accelerator": "cpu", "gpus": 0},
            "adapters": [{"name": "pirate", "source": "/adapters/pirate"}]}  # fmt: skip
    await lab.create("lora", spec)

    async def failed() -> bool:
        return (await lab.condition("lora", "AdaptersReady")).get("reason") == "LoadFailed"

    await lab.until(failed, within=60, what="LoadFailed while no engine answers")
    lab.pods.unreachable.clear()  # an engine now answers at the pod IP; nothing in the cluster changes

    async def loaded() -> bool:
        return (await lab.condition("lora", "AdaptersReady")).get("reason") == "Loaded"

    took = await lab.until(loaded, within=15, what="loaded by a retry")
    print(f"cluster: adapter loaded {took:.1f} s after the engine answered (retry every 2 s)")
    assert len(await lab.events("lora", "AdapterLoadFailed")) == 1
