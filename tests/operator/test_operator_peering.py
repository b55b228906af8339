"""`fleetgate operator` with Kopf peering against kmock: it never sits paused in silence.

- The peering object is missing: the operator creates the one ClusterKopfPeering and reconciles.
- The peering CRD is missing: it runs standalone, says so at WARNING, and reconciles.
- A live peer with a higher priority (a developer's `--priority 100`) sits in the ClusterKopfPeering:
  the operator pauses and says so at WARNING.
- A namespaced operator (as the chart runs it) peers through that same cluster-wide object. (kmock
  cannot serve the namespace list a namespaced Kopf operator asks for, so the operators here watch
  cluster-wide, and the scope switch is checked on the startup step itself.)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

import kmock
import kopf
import pytest

from fleetgate.operator.apisim import VERBS, new_emulator
from fleetgate.operator.crd import build_peering_crds
from fleetgate.operator.embedded import running_operator

from .conftest import Cluster, operator_registry, serving, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(60)]
SPEC = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"},
        "resources": {"accelerator": "nvidia-l4", "gpus": 1}}  # fmt: skip


@pytest.fixture
async def peering_cluster() -> AsyncIterator[Cluster]:
    server = new_emulator()
    server.resources["kopf.dev/v1/clusterkopfpeerings"] = kmock.ResourceInfo(
        kind="ClusterKopfPeering", namespaced=False, subresources=(), verbs=set(VERBS)
    )
    async with serving(server) as served:
        yield served


async def _install_peering_crd(cluster: Cluster) -> None:
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    cluster_crd = next(c for c in build_peering_crds() if c["spec"]["scope"] == "Cluster")
    await cluster.api._client.create(CustomResourceDefinition.from_dict(cluster_crd))


@contextlib.asynccontextmanager
async def _operator(cluster: Cluster, *, priority: int = 0) -> AsyncIterator[None]:
    """The operator with peering `fleetgate` (not standalone), cluster-wide (see the module docstring)."""
    async with running_operator(
        registry=operator_registry(cluster), clusterwide=True, standalone=False, peering_name="fleetgate",
        priority=priority, memo=kopf.Memo(), ready_within=20, stop_within=10,
    ):  # fmt: skip
        yield


def _cr(name: str) -> dict[str, Any]:
    return {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "default"}, "spec": SPEC}  # fmt: skip


def _peerings(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw
        for (resource, _ns, name), obj in cluster.server.objects.items()
        if resource.plural == "clusterkopfpeerings" and not obj.deleted
    }


def _phase(cluster: Cluster, name: str) -> str | None:
    return (cluster.objects("inferenceservices").get(name, {}).get("status") or {}).get("phase")


async def test_missing_peering_object_is_created_and_the_operator_reconciles(peering_cluster: Cluster) -> None:
    await _install_peering_crd(peering_cluster)
    assert not _peerings(peering_cluster)
    async with _operator(peering_cluster):
        await peering_cluster.create(_cr("first-run"))
        await wait_for(lambda: _phase(peering_cluster, "first-run") == "Pending", within=15, what="reconciled")
        await wait_for(lambda: bool(_peerings(peering_cluster).get("fleetgate", {}).get("status")), what="heartbeat")
    assert set(_peerings(peering_cluster)) == {"fleetgate"}


async def test_without_the_peering_crd_it_runs_standalone_and_warns(
    peering_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with _operator(peering_cluster):
        await peering_cluster.create(_cr("no-crd"))
        await wait_for(lambda: _phase(peering_cluster, "no-crd") == "Pending", within=15, what="reconciled")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "STANDALONE" in r.getMessage()]
    assert warnings and "ClusterKopfPeering CRD is not installed" in warnings[0].getMessage()


async def test_a_higher_priority_peer_pauses_a_namespaced_operator_loudly(
    peering_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    from lightkube.generic_resource import create_global_resource

    caplog.set_level(logging.INFO)
    await _install_peering_crd(peering_cluster)
    peering = create_global_resource("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings")
    now = dt.datetime.now(dt.UTC).isoformat()
    await peering_cluster.api._client.create(peering.from_dict({
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "fleetgate"},
        "status": {"dev@laptop": {"priority": 100, "lifetime": 60, "lastseen": now}},
    }))  # fmt: skip
    async with _operator(peering_cluster, priority=0):
        await peering_cluster.create(_cr("paused"))
        await wait_for(
            lambda: any(r.levelno == logging.WARNING and "PAUSED" in r.getMessage() for r in caplog.records),
            within=15,
            what="a WARNING that the operator paused",
        )
        await asyncio.sleep(1.0)
        assert _phase(peering_cluster, "paused") is None, "a paused operator reconciled"
        assert "paused" not in peering_cluster.objects("deployments")


class _PeeringApi:
    def __init__(self, state: str) -> None:
        self.state = state
        self.asked: list[str] = []

    async def ensure_cluster_peering(self, *, name: str) -> tuple[str, dict[str, Any]]:
        self.asked.append(name)
        return self.state, {}


@pytest.mark.parametrize(("state", "standalone"), [("exists", False), ("created", False), ("no-crd", True)])
async def test_a_namespaced_operator_peers_cluster_wide(state: str, standalone: bool) -> None:
    from fleetgate.operator.handlers import _join_peering

    settings = kopf.OperatorSettings()
    settings.peering.name, settings.peering.clusterwide, settings.peering.mandatory = "fleetgate", False, True
    api = _PeeringApi(state)
    await _join_peering(api=api, settings=settings, logger=logging.getLogger("test"))  # type: ignore[arg-type]
    assert api.asked == ["fleetgate"]
    assert settings.peering.clusterwide, "a namespaced operator must use the ClusterKopfPeering too"
    assert settings.peering.standalone is standalone and settings.peering.mandatory is not standalone
