"""InferencePools published by the running operator (kmock): created, updated, withdrawn, and said in status.

The pool follows the Gateway API Inference Extension's implementer guide: the engine pods' selector and port,
`endpointPickerRef` to the picker Service, and no ownerReference or label claiming it. Without the CRD the
operator publishes nothing and says so in `status.inferencePool`.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from fleetgate.engine.kube_names import (
    ANNOTATION_KV_EVENTS_TOPIC,
    KV_EVENTS_PORT_NAME,
    KV_REPLAY_PORT_NAME,
    POOL_CRD,
    POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
)
from fleetgate.operator.apisim import VERBS, new_emulator
from fleetgate.operator.builders.inferencepool import ANNOTATION_PUBLISHED_UID
from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.kube import API_CALLS, KubeApi, resource_class
from fleetgate.operator.pools import PoolPublisher
from fleetgate.operator.rbac import allows
from fleetgate.operator.settings import OperatorSettings

from .conftest import Cluster, serving, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

SPEC: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ", "servedName": "qwen"},
    "engine": {"quantization": "awq_marlin", "maxModelLen": 8192, "maxNumSeqs": 24},
    "resources": {"accelerator": "nvidia-l4", "gpus": 1},
    "replicas": 1,
}


def _cr(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "default"}, "spec": copy.deepcopy(spec or SPEC)}


def with_pools() -> Any:
    server = new_emulator()
    server.resources[f"{POOL_GROUP}/{POOL_VERSION}/{POOL_PLURAL}"] = kmock.ResourceInfo(
        kind="InferencePool", namespaced=True, verbs=set(VERBS))
    return server


@pytest.fixture
def operator_settings() -> OperatorSettings:
    return OperatorSettings(epp_service="fleetgate-epp", epp_port=9002, epp_failure_mode="FailOpen")


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    crd = getattr(request, "param", True)
    async with serving(with_pools() if crd else new_emulator()) as served:
        if crd:  # what the operator checks for (kmock itself would accept any resource)
            from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

            await served.api._client.create(CustomResourceDefinition.from_dict({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": POOL_CRD}, "spec": {"group": POOL_GROUP, "scope": "Namespaced", "names": {
                    "plural": POOL_PLURAL, "kind": "InferencePool"}, "versions": []}}))
        yield served


async def add_picker_service(cluster: Cluster) -> None:
    from lightkube.resources.core_v1 import Service

    await cluster.api._client.create(Service.from_dict({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "fleetgate-epp", "namespace": "default"},
        "spec": {"ports": [{"port": 9002}], "selector": {"app": "epp"}}}))


def pool_status(cluster: Cluster, name: str) -> dict[str, Any]:
    return (cluster.objects("inferenceservices").get(name, {}).get("status") or {}).get("inferencePool") or {}


async def test_pool_is_published_updated_and_withdrawn(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await add_picker_service(cluster)
    await cluster.create(_cr("qwen"))
    await wait_for(lambda: "qwen" in cluster.objects(POOL_PLURAL), what="the pool")
    pool = cluster.objects(POOL_PLURAL)["qwen"]
    isvc = cluster.objects("inferenceservices")["qwen"]
    assert pool["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "fleetgate-engine",
                                                       "app.kubernetes.io/instance": "qwen"}
    assert cluster.objects("deployments")["qwen"]["spec"]["selector"]["matchLabels"] == \
        pool["spec"]["selector"]["matchLabels"]  # exactly the engine pods
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "fleetgate-epp",
                                                 "port": {"number": 9002}, "failureMode": "FailOpen"}
    meta = pool["metadata"]
    assert "ownerReferences" not in meta and "labels" not in meta  # shared ownership: nothing claims the pool
    assert meta["annotations"]["fleetgate.io/served-model"] == "qwen"
    assert meta["annotations"][ANNOTATION_PUBLISHED_UID] == isvc["metadata"]["uid"]
    assert ANNOTATION_KV_EVENTS_TOPIC not in meta["annotations"]  # the engines publish no KV events
    await wait_for(lambda: pool_status(cluster, "qwen").get("phase") == "Published", what="Published status")
    assert "fleetgate-epp:9002" in pool_status(cluster, "qwen")["message"]

    await cluster.patch_spec("qwen", {"model": {"servedName": "qwen-7b"}})
    await wait_for(lambda: cluster.objects(POOL_PLURAL)["qwen"]["metadata"]["annotations"][
        "fleetgate.io/served-model"] == "qwen-7b", what="the pool updated")
    # KV events on: the pool names their topic; the engine pods name the ports the picker's discovery reads
    await cluster.patch_spec("qwen", {"engine": {"prefixCaching": True, "kvEvents": {"topic": "qwen-kv"}}})
    await wait_for(lambda: cluster.objects(POOL_PLURAL)["qwen"]["metadata"]["annotations"].get(
        ANNOTATION_KV_EVENTS_TOPIC) == "qwen-kv", what="the pool's KV-event topic")
    (container,) = cluster.objects("deployments")["qwen"]["spec"]["template"]["spec"]["containers"]
    assert {p["name"] for p in container["ports"]} >= {KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME}
    # the reconciler's own status writes leave the pool's status alone
    await cluster.fake_rollout("qwen", ready=1)
    await wait_for(lambda: (cluster.objects("inferenceservices")["qwen"].get("status") or {}).get("phase") == "Ready",
                   what="Ready")
    assert pool_status(cluster, "qwen").get("phase") == "Published"

    await cluster.delete("qwen")
    await wait_for(lambda: "qwen" not in cluster.objects(POOL_PLURAL), what="the pool withdrawn with its service")
    methods = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
    made = set()
    for request in cluster.server:  # every pool call the operator made is one its RBAC grants
        res = request.resource
        if res is None or res.plural != POOL_PLURAL or request.params.get("fieldManager") == "test":
            continue
        verb = methods[str(request.method.value).upper()]
        if verb == "get" and request.name is None:
            verb = "watch" if request.params.get("watch") in ("true", "1") else "list"
        assert allows(group=res.group, resource=res.plural, verb=verb) and (res.group, res.plural, verb) in API_CALLS
        made.add(verb)
    assert {"patch", "get", "delete"} <= made


async def test_missing_picker_service_is_said(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await cluster.create(_cr("qwen"))
    await wait_for(lambda: pool_status(cluster, "qwen").get("phase") == "EndpointPickerMissing", what="status")
    assert "no Service 'fleetgate-epp' in namespace 'default'" in pool_status(cluster, "qwen")["message"]
    assert "qwen" in cluster.objects(POOL_PLURAL)  # published anyway: the Service may come later


@pytest.mark.parametrize("cluster", [False], indirect=True)
async def test_without_the_crd_nothing_is_created_and_status_says_so(cluster: Cluster,
                                                                    operator: EmbeddedOperator) -> None:
    await add_picker_service(cluster)
    await cluster.create(_cr("qwen"))
    await wait_for(lambda: pool_status(cluster, "qwen").get("phase") == "CRDAbsent", what="CRDAbsent status")
    assert "inference.networking.k8s.io/v1" in pool_status(cluster, "qwen")["message"]
    await wait_for(lambda: (cluster.objects("inferenceservices")["qwen"].get("status") or {}).get("phase") == "Pending",
                   what="the service itself reconciled as usual")
    assert not [e for e in cluster.objects("events").values() if e.get("reason") == "InferencePoolFailed"]
    assert not cluster.objects(POOL_PLURAL)


async def test_sweep_removes_only_pools_of_services_that_are_gone(cluster: Cluster) -> None:
    api = KubeApi.from_server(url=cluster.url, field_manager="fleetgate-operator")
    publisher = PoolPublisher(api=api, settings=OperatorSettings(epp_service="fleetgate-epp"))
    try:
        for name in ("kept", "gone", "replaced"):
            await cluster.create(_cr(name))
            body = await api.get_inference_service(namespace="default", name=name)
            assert body is not None and (await publisher.publish(body)) is not None
        foreign = {"apiVersion": f"{POOL_GROUP}/{POOL_VERSION}", "kind": "InferencePool",
                   "metadata": {"name": "someone-elses", "namespace": "default"},
                   "spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 8000}]}}
        await cluster.api._client.create(resource_class(POOL_GROUP, POOL_VERSION, "InferencePool",
                                                        POOL_PLURAL).from_dict(foreign))
        await cluster.delete("gone")  # deleted while no operator watched
        await cluster.delete("replaced")
        await cluster.create(_cr("replaced"))  # a new object of the same name: not the pool's service
        assert sorted(await publisher.sweep()) == ["default/gone", "default/replaced"]
        assert set(cluster.objects(POOL_PLURAL)) == {"kept", "someone-elses"}
        assert await publisher.sweep() == []
    finally:
        await api.aclose()
