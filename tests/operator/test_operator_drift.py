"""Children that someone edits are put back (level-based for edits, not only for deletions), with one
DriftCorrected Event naming the field; an autoscaler's replicas are never fought.

kmock serves `application/apply-patch+yaml` as a merge (`fleetgate.operator.apisim`), which puts back every
field the operator applies; where a real API server refuses the apply instead, the operator falls back to a
merge patch (test_operator_drift_fallback.py). The real server's side is in test_operator_envtest.py."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
from lightkube.types import PatchType

from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.kube import resource_class
from fleetgate.operator.settings import DEFAULT_ENGINE_IMAGE

from .conftest import Cluster, wait_for
from .test_operator_kmock import SMALL, _cr, _events, _status

pytestmark = [pytest.mark.kube, pytest.mark.timeout(90)]
DEPLOYMENTS = ("apps", "v1", "Deployment", "deployments")
SERVICES = ("", "v1", "Service", "services")


async def _patch(cluster: Cluster, kind: tuple[str, str, str, str], name: str, body: dict[str, Any]) -> None:
    await cluster.api._client.patch(resource_class(*kind), name, body, namespace="default", patch_type=PatchType.MERGE)


async def _serving(cluster: Cluster, name: str, spec: dict[str, Any] = SMALL) -> None:
    await cluster.create(_cr(name, spec))
    await wait_for(lambda: _status(cluster, name).get("phase") == "Pending", what="reconciled")
    await cluster.fake_rollout(name, ready=1)
    await wait_for(lambda: _status(cluster, name).get("phase") == "Ready", what="Ready")


def _drift_events(cluster: Cluster) -> list[str]:
    return sorted(e["message"] for e in _events(cluster, "DriftCorrected"))


async def test_scale_set_image_and_patch_svc_are_put_back_within_5_s_with_one_event_each(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    await _serving(cluster, "qwen")
    t0 = time.monotonic()
    await _patch(cluster, DEPLOYMENTS, "qwen", {"spec": {"replicas": 3}})  # kubectl scale deploy --replicas=3
    await wait_for(lambda: cluster.objects("deployments")["qwen"]["spec"]["replicas"] == 1, within=5, what="replicas")
    containers = copy.deepcopy(cluster.objects("deployments")["qwen"]["spec"]["template"]["spec"]["containers"])
    containers[0]["image"] = "evil/image:1"  # kubectl set image deploy/qwen engine=evil/image:1
    await _patch(cluster, DEPLOYMENTS, "qwen", {"spec": {"template": {"spec": {"containers": containers}}}})
    await wait_for(lambda: cluster.objects("deployments")["qwen"]["spec"]["template"]["spec"]["containers"][0][
        "image"] == DEFAULT_ENGINE_IMAGE, within=5, what="image")  # fmt: skip
    ports = copy.deepcopy(cluster.objects("services")["qwen"]["spec"]["ports"])
    ports[0]["port"] = 9000
    await _patch(cluster, SERVICES, "qwen", {"spec": {"ports": ports}})
    await wait_for(lambda: cluster.objects("services")["qwen"]["spec"]["ports"][0]["port"] == 8000, within=5,
                   what="port")  # fmt: skip
    print(f"kmock: three edits put back in {time.monotonic() - t0:.2f} s")
    await wait_for(lambda: len(_drift_events(cluster)) == 3, what="three DriftCorrected Events")
    await asyncio.sleep(0.5)
    assert _drift_events(cluster) == [
        "Deployment qwen: put back spec.replicas (was 3)",
        "Deployment qwen: put back spec.template.spec.containers[engine].image (was 'evil/image:1')",
        "Service qwen: put back spec.ports[http].port (was 9000)",
    ]
    assert _status(cluster, "qwen")["endpoint"] == "http://qwen.default.svc.cluster.local:8000"
    assert not operator.done()


async def test_an_autoscaler_owns_replicas_and_is_never_fought(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await _serving(cluster, "auto", {**copy.deepcopy(SMALL), "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})
    await _patch(cluster, DEPLOYMENTS, "auto", {"spec": {"replicas": 4}})  # what the HPA does
    await asyncio.sleep(1.5)
    assert cluster.objects("deployments")["auto"]["spec"]["replicas"] == 4
    assert not _drift_events(cluster)


async def test_status_changes_and_foreign_fields_cause_no_write(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await _serving(cluster, "calm")
    await _patch(cluster, DEPLOYMENTS, "calm", {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "2"}},
                                                "spec": {"revisionHistoryLimit": 5}})  # fmt: skip
    await cluster.fake_rollout("calm", ready=1)
    before = len(list(cluster.server))
    await asyncio.sleep(1.0)
    writes = [r for r in list(cluster.server)[before:] if str(r.method.value).upper() == "PATCH"
              and r.resource is not None and r.resource.plural in ("deployments", "services")]  # fmt: skip
    assert not writes and not _drift_events(cluster)
