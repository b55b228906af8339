"""The e2e suite's InferenceService fixture deletes its CR when the test fails (kmock stands in for the
cluster: KubeApi.from_env is pointed at it)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.operator.kube import KubeApi, resource_class

from .conftest import Cluster
from .test_operator_e2e import SMALL, _cr, e2e_isvc

pytestmark = [pytest.mark.kube, pytest.mark.timeout(60)]


async def test_e2e_fixture_deletes_the_cr_of_a_failed_test(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        KubeApi, "from_env", classmethod(lambda cls, **kw: KubeApi.from_server(url=cluster.url, **kw))
    )
    fixture: Any = e2e_isvc.__wrapped__()  # type: ignore[attr-defined]
    api, name = await fixture.__anext__()
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    await api._client.create(isvc.from_dict(_cr(name, SMALL)))
    assert name in cluster.objects("inferenceservices")
    # The test body fails here (before its own delete); pytest then runs the fixture's teardown.
    with pytest.raises(StopAsyncIteration):
        await fixture.__anext__()
    assert name not in cluster.objects("inferenceservices"), "the failed e2e test leaked its InferenceService"
