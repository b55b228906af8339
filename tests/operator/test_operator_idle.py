"""Idle scale-down: the operator scales an InferenceService with `scaleToZeroAfterSeconds` to zero once the
gateway's last-request mark is older than that; a wake (replicas back up, a fresh mark) sticks."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

import pytest

from fleetgate.gateway.discovery import ModelListing
from fleetgate.gateway.discovery.kubernetes import KubernetesEndpointSource
from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.idle import idle_patch
from fleetgate.operator.rbac import allows
from fleetgate.operator.settings import OperatorSettings

from .conftest import Cluster, wait_for


def _client(url: str) -> Any:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.config.models import Cluster as KubeCluster
    from lightkube.config.models import User

    return AsyncClient(config=KubeConfig.from_one(cluster=KubeCluster(server=url), user=User()))


pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]
NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
OLD = "2026-11-24T10:00:00Z"
SPEC: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ", "servedName": "qwen"},
    "engine": {"quantization": "awq_marlin", "maxModelLen": 8192, "maxNumSeqs": 24},
    "resources": {"accelerator": "nvidia-l4", "gpus": 1},
    "replicas": 2,
    "scaleToZeroAfterSeconds": 600,
}


def _body(*, last: str | None, created: str = OLD, **spec: Any) -> dict[str, Any]:
    annotations = {"fleetgate.io/last-request": last} if last else {}
    return {"metadata": {"name": "q", "namespace": "default", "creationTimestamp": created,
                         "annotations": annotations}, "spec": {**SPEC, **spec}}


def test_idle_patch_scales_to_zero_and_remembers_the_replicas() -> None:
    assert idle_patch(_body(last="2026-11-24T11:49:00Z"), now=NOW) == {
        "metadata": {"annotations": {"fleetgate.io/wake-replicas": "2"}}, "spec": {"replicas": 0}}


@pytest.mark.parametrize("body", [
    _body(last="2026-11-24T11:55:00Z"),  # a request 5 min ago
    _body(last=None, created="2026-11-24T11:59:00Z"),  # created a minute ago, never asked for
    _body(last=OLD, replicas=0),  # already at zero
    _body(last=OLD, scaleToZeroAfterSeconds=None),  # not opted in
])
def test_not_idle_or_not_opted_in_is_left_alone(body: dict[str, Any]) -> None:
    assert idle_patch(body, now=NOW) is None


@pytest.fixture
def operator_settings() -> OperatorSettings:
    return OperatorSettings(idle_check_s=0.2)


async def test_idle_service_is_scaled_to_zero_and_a_wake_sticks(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cr = {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
          "metadata": {"name": "qwen", "namespace": "default", "creationTimestamp": OLD,
                       "annotations": {"fleetgate.io/last-request": OLD}},
          "spec": copy.deepcopy(SPEC)}
    await cluster.create(cr)
    isvc = lambda: cluster.objects("inferenceservices").get("qwen", {})  # noqa: E731
    deployment = lambda: cluster.objects("deployments").get("qwen", {})  # noqa: E731
    await wait_for(lambda: isvc()["spec"].get("replicas") == 0, within=15, what="scaled to zero")
    assert isvc()["metadata"]["annotations"]["fleetgate.io/wake-replicas"] == "2"
    await wait_for(lambda: deployment().get("spec", {}).get("replicas") == 0, what="Deployment at zero")
    await wait_for(lambda: (isvc().get("status") or {}).get("phase") == "ScaledToZero", what="ScaledToZero phase")
    [event] = [e for e in cluster.objects("events").values() if e.get("reason") == "ScaledToZeroIdle"]
    assert "no request for 600 s" in event["message"] and "from 2 replicas" in event["message"]
    patches = [r for r in cluster.server if r.method == "PATCH" and str(r.url).endswith("/inferenceservices/qwen")]
    assert patches and allows(group="fleetgate.io", resource="inferenceservices", verb="patch")

    # The gateway's discovery offers it as scaled to zero; a request marks it active and wakes it through
    # the scale subresource, to the replicas it had.
    source = KubernetesEndpointSource(client_factory=lambda: _client(cluster.url), namespace="default",
                                      label_selector="app.kubernetes.io/managed-by=fleetgate", resync_s=60)
    await source.start()
    try:
        assert source.listing() == [ModelListing(name="qwen", ready=False, scaled_to_zero=True, wakeable=True)]
        [target] = source.wake_targets("qwen")
        assert target.replicas == 2
        await source.mark_active("qwen")
        await source.scale(target)
    finally:
        await source.aclose()
    assert any(r.method == "PATCH" and str(r.url).endswith("/inferenceservices/qwen/scale") for r in cluster.server)
    await wait_for(lambda: deployment()["spec"].get("replicas") == 2, what="woken to 2")
    await asyncio.sleep(1.0)  # several idle passes
    assert isvc()["spec"]["replicas"] == 2 and deployment()["spec"]["replicas"] == 2
