"""A child the API server refuses (here: kmock made to fail every write of one Service) leaves the
InferenceService Degraded/ApplyFailed and not Ready, with one Warning Event, instead of a silent Pending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetgate.operator.apisim import RESOURCES, VERBS, ApiServerEmulator
from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.settings import OperatorSettings

from .conftest import Cluster, serving, wait_for
from .test_operator_kmock import SMALL, _cond, _cr, _events, _status

pytestmark = [pytest.mark.kube, pytest.mark.timeout(60)]


class RefusingEmulator(ApiServerEmulator):
    """Refuses every write of the Service named `refused` (the API server's answer to a bad child)."""

    async def _handle(self, request: Any) -> Any:
        res = request.resource
        if res is not None and res.plural == "services" and request.name == "refused" and request.method != "GET":
            raise ValueError("Service refused by admission (test)")
        return await super()._handle(request)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    import kmock

    server = RefusingEmulator()
    for path, (kind, namespaced, subresources) in RESOURCES.items():
        server.resources[path] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, subresources=subresources, verbs=set(VERBS)
        )
    async with serving(server) as served:
        yield served


@pytest.fixture
def operator_settings() -> OperatorSettings:
    return OperatorSettings(retry_failed_s=300)  # one pass in this test, no retry


async def test_a_refused_child_is_reported_not_hidden(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await cluster.create(_cr("refused", SMALL))
    await wait_for(lambda: _status(cluster, "refused").get("phase") == "Degraded", what="Degraded status")
    assert _cond(cluster, "refused", "Degraded") == ("True", "ApplyFailed")
    assert _cond(cluster, "refused", "Ready") == ("False", "ApplyFailed")
    assert "refused" in cluster.objects("deployments") and "refused" not in cluster.objects("services")
    await cluster.fake_rollout("refused", ready=1)  # pods ready, but no Service: still not Ready
    await asyncio.sleep(0.5)
    assert _status(cluster, "refused").get("phase") == "Degraded"
    await wait_for(lambda: bool(_events(cluster, "ApplyFailed")), what="ApplyFailed event")
    assert len(_events(cluster, "ApplyFailed")) == 1, "one Event per failure, not one per pass"
    assert "Service/refused" in _events(cluster, "ApplyFailed")[0]["message"]
