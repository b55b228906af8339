"""Putting back an edit that server-side apply cannot undo: the merge-patch fallback.

Seen on a v1.36 API server (the k8s lab): after `kubectl patch svc --type=json` moved the Service's port
from 8000 to 9000, the edited port belongs to `kubectl-patch`; the operator's apply of port 8000 (also
named `http`) joins it instead of replacing it, and the server refuses two ports of one name: 422
Duplicate value. The operator then merge-patches the owned fields (lists replaced whole) and applies again.
kmock's apply is a merge and never refuses, so `DuplicatePortEmulator` answers as that server does."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from fleetgate.operator.apisim import RESOURCES, VERBS, ApiServerEmulator
from fleetgate.operator.embedded import EmbeddedOperator

from .conftest import Cluster, serving, wait_for
from .test_operator_drift import SERVICES, _drift_events, _patch, _serving
from .test_operator_kmock import _events, _status

pytestmark = [pytest.mark.kube, pytest.mark.timeout(60)]


class DuplicatePortEmulator(ApiServerEmulator):
    """Serves server-side apply of a Service as a v1.36 API server does when the live Service holds a port of
    another manager with the applied port's name: SSA merges ports by (port, protocol), so both would stay,
    and the Service would have two ports named alike: 422. Counts the operator's merge patches of Services."""

    merge_patches = 0

    async def _handle(self, request: Any) -> Any:
        res, content = request.resource, request.headers.get("Content-Type") or ""
        if res is not None and res.plural == "services" and request.name and "apply-patch" in content:
            key = (res, request.namespace, request.name)
            if key in self._objects and not self._objects[key].deleted:
                live = self._objects[key].raw
                have = {p.get("name"): p.get("port") for p in live.get("spec", {}).get("ports") or []}
                for port in (request.data.get("spec") or {}).get("ports") or []:
                    if port.get("name") in have and have[port["name"]] != port.get("port"):
                        raise kmock.KubernetesError(status=422, reason="Invalid", message=(
                            f'Service "{request.name}" is invalid: spec.ports[1].name: Duplicate value: '
                            f'"{port["name"]}"'))  # fmt: skip
        operator = request.params.get("fieldManager") == "fleetgate-operator"
        if res is not None and res.plural == "services" and "merge-patch" in content and operator:
            self.merge_patches += 1
        return await super()._handle(request)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    server = DuplicatePortEmulator()
    for path, (kind, namespaced, subresources) in RESOURCES.items():
        server.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, subresources=subresources,
                                                    verbs=set(VERBS))  # fmt: skip
    async with serving(server) as served:
        yield served


async def test_an_edit_apply_cannot_undo_is_put_back_by_a_merge_patch(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    await _serving(cluster, "qwen")
    ports = copy.deepcopy(cluster.objects("services")["qwen"]["spec"]["ports"])
    ports[0]["port"] = 9000  # kubectl patch svc qwen --type=json: replace /spec/ports/0/port
    await _patch(cluster, SERVICES, "qwen", {"spec": {"ports": ports}})
    await wait_for(lambda: cluster.objects("services")["qwen"]["spec"]["ports"][0]["port"] == 8000, within=5,
                   what="port put back")  # fmt: skip
    assert cluster.server.merge_patches == 1
    await wait_for(lambda: len(_drift_events(cluster)) == 1, what="one Event")
    assert _drift_events(cluster) == ["Service qwen: put back spec.ports[http].port (was 9000)"]
    assert _status(cluster, "qwen")["phase"] == "Ready"  # never ApplyFailed on the way
    assert not _events(cluster, "ApplyFailed")
