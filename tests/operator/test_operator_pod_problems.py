"""Pods the cluster refuses are visible in status: the ReplicaSet's FailedCreate (via the Deployment's
ReplicaFailure condition), a pod's FailedScheduling, a container's waiting reason; one Event per problem.
And two InferenceServices serving one model name are flagged. kmock runs no controllers: the test plays
the Deployment controller, the scheduler and the kubelet by writing the status they would write."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.settings import OperatorSettings

from .conftest import Cluster, wait_for
from .test_operator_kmock import SMALL, _cr, _events, _status

pytestmark = [pytest.mark.kube, pytest.mark.timeout(90)]
FAST = pytest.mark.parametrize("operator_settings", [OperatorSettings(pod_check_s=0.3)], ids=["pod-check-0.3s"])


def _degraded(cluster: Cluster, name: str) -> dict[str, Any]:
    return next((c for c in _status(cluster, name).get("conditions") or [] if c["type"] == "Degraded"), {})


async def _deployment_status(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    from lightkube.types import PatchType

    from fleetgate.operator.kube import resource_class

    cls = resource_class("apps", "v1", "Deployment", "deployments")
    await cluster.api._client.patch(cls.Status, name, {"status": status}, namespace="default",
                                    patch_type=PatchType.MERGE)  # fmt: skip


async def _pending_pod(cluster: Cluster, owner: str, name: str, status: dict[str, Any]) -> None:
    from lightkube.resources.core_v1 import Pod

    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {
        "app.kubernetes.io/name": "fleetgate-engine", "app.kubernetes.io/instance": owner}},
        "spec": {"containers": [{"name": "engine", "image": "vllm"}]}, "status": status}  # fmt: skip
    await cluster.api._client.create(Pod.from_dict(body))


@FAST
async def test_a_replica_set_refused_by_pod_security_is_degraded_with_the_reason(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    await cluster.create(_cr("rooted", SMALL))
    await wait_for(lambda: _status(cluster, "rooted").get("phase") == "Pending", what="Pending")
    refusal = ('pods "rooted-67c74f8488-sjm4v" is forbidden: violates PodSecurity "restricted:latest": '
               "runAsUser=0 (pod must not set runAsUser=0)")  # fmt: skip
    await _deployment_status(cluster, "rooted", {"observedGeneration": 1, "replicas": 0, "conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refusal}]})  # fmt: skip
    await wait_for(lambda: _degraded(cluster, "rooted").get("reason") == "FailedCreate", within=5, what="FailedCreate")
    assert _degraded(cluster, "rooted")["message"] == refusal and _status(cluster, "rooted")["phase"] == "Degraded"
    await asyncio.sleep(1.0)  # re-checks every 0.3 s find the same problem: no second Event
    (event,) = _events(cluster, "FailedCreate")
    assert event["type"] == "Warning" and event["message"] == refusal


@FAST
async def test_an_unschedulable_pod_and_a_missing_secret_are_named_without_any_deployment_event(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    await cluster.create(_cr("big", SMALL))
    await wait_for(lambda: _status(cluster, "big").get("phase") == "Pending", what="Pending")
    await _deployment_status(cluster, "big", {"observedGeneration": 1, "replicas": 1, "unavailableReplicas": 1})
    await asyncio.sleep(0.5)
    # The scheduler's verdict lands on the pod only: the operator's re-check finds it.
    await _pending_pod(cluster, "big", "big-5d8f-a", {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": '0/3 nodes are available: persistentvolumeclaim "lora-adapters" not found. not found'}]})
    await wait_for(lambda: _degraded(cluster, "big").get("reason") == "FailedScheduling", within=5, what="scheduling")
    assert 'persistentvolumeclaim "lora-adapters" not found' in _degraded(cluster, "big")["message"]
    await wait_for(lambda: len(_events(cluster, "FailedScheduling")) == 1, what="one FailedScheduling Event")

    from lightkube.resources.core_v1 import Pod

    await cluster.api._client.delete(Pod, "big-5d8f-a", namespace="default")
    await _pending_pod(cluster, "big", "big-5d8f-b", {"phase": "Pending", "containerStatuses": [
        {"name": "engine", "image": "vllm", "imageID": "", "ready": False, "restartCount": 0, "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}}]})  # fmt: skip
    await wait_for(lambda: _degraded(cluster, "big").get("reason") == "CreateContainerConfigError", within=5,
                   what="waiting reason")  # fmt: skip
    assert 'secret "hf-token" not found' in _degraded(cluster, "big")["message"]
    await wait_for(lambda: len(_events(cluster, "CreateContainerConfigError")) == 1, what="one Event")


async def test_two_services_serving_one_model_name_are_flagged(cluster: Cluster, operator: EmbeddedOperator) -> None:
    def unique(name: str) -> tuple[str, str, str] | None:
        cond = next((c for c in _status(cluster, name).get("conditions") or [] if c["type"] == "ServedModelUnique"),
                    None)  # fmt: skip
        return (cond["status"], cond["reason"], cond["message"]) if cond else None

    await cluster.create(_cr("pool-a", SMALL))
    await wait_for(lambda: (unique("pool-a") or ("",))[0] == "True", what="unique")
    other = copy.deepcopy(SMALL)
    other["model"]["source"] = "hf://Qwen/Qwen2.5-7B-Instruct"  # same served name "qwen", another model
    other["engine"] = {"maxModelLen": 8192}
    await cluster.create(_cr("pool-b", other))
    await wait_for(lambda: (unique("pool-b") or ("",))[0] == "False", what="flagged")
    _status_value, reason, message = unique("pool-b") or ("", "", "")
    assert reason == "SharedModelName" and "'qwen'" in message
    assert "pool-a (another source: hf://Qwen/Qwen2.5-7B-Instruct-AWQ)" in message

    def flagged_events(name: str) -> int:
        return sum(e["involvedObject"]["name"] == name for e in _events(cluster, "SharedModelName"))

    # pool-b says it once. pool-a, re-checked whenever its pods are (pod_check_s), may say so too, about
    # pool-b: it shares the name as much. Neither says it twice for one unchanged verdict.
    await wait_for(lambda: flagged_events("pool-b") == 1, what="one Event on pool-b")
    await asyncio.sleep(1.0)
    assert flagged_events("pool-b") == 1 and flagged_events("pool-a") <= 1
