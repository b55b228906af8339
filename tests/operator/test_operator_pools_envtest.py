"""InferencePools against a real API server (envtest: KUBEBUILDER_ASSETS), with the Inference Extension's own CRD.

The vendored CRD (tests/data/crds, GIE v1.6.0) is installed only after a first InferenceService was reconciled
without it, so one test sees the whole story: CRDAbsent in status and no pool; the CRD installed; the pool
published by the sweep, accepted by the real API server's validation (its CEL rule on endpointPickerRef, its
defaults); updated with the service; and deleted by the operator when the service goes (envtest runs no garbage
collector, so nothing else could delete it). Skipped, saying so, where the envtest binaries are not installed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.engine.kube_names import POOL_CRD, POOL_GROUP, POOL_PLURAL, POOL_VERSION
from fleetgate.operator.kube import KubeApi, resource_class, status_code
from fleetgate.operator.settings import OperatorSettings

from . import test_operator_envtest as envtest
from .test_operator_envtest import SMALL, _cr, _running_operator, apiserver, real_api  # noqa: F401 (fixtures)

pytestmark = envtest.pytestmark  # the same tier: skipped, saying so, without the envtest binaries
VENDORED = Path(__file__).resolve().parents[1] / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
SETTINGS = OperatorSettings(epp_service="fleetgate-epp", epp_port=9002, pool_sweep_s=0.5)


async def until(check: Callable[[], Awaitable[Any]], *, within: float = 30.0, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def install_pool_crd(api: KubeApi) -> None:
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    await api._client.create(CustomResourceDefinition.from_dict(yaml.safe_load(VENDORED.read_text())))

    async def established() -> bool:
        stored = await api._client.get(CustomResourceDefinition, POOL_CRD)
        return any(c.type == "Established" and c.status == "True" for c in (stored.status.conditions or []))

    await until(established, what="the InferencePool CRD established")


async def test_pool_lifecycle_with_the_inference_extension_crd(apiserver: str, real_api: KubeApi) -> None:  # noqa: F811
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    pools = resource_class(POOL_GROUP, POOL_VERSION, "InferencePool", POOL_PLURAL)

    async def pool_status(name: str) -> dict[str, Any]:
        body = await real_api.get_inference_service(namespace="default", name=name) or {}
        return dict((body.get("status") or {}).get("inferencePool") or {})

    async def pool(name: str) -> dict[str, Any] | None:
        try:
            return dict(await real_api._client.get(pools, name, namespace="default"))
        except Exception as exc:
            if status_code(exc) == 404:
                return None
            raise

    async with _running_operator(apiserver, SETTINGS):
        await real_api._client.create(isvc.from_dict(_cr("pooled", {**SMALL, "model": {**SMALL["model"],
                                                                                         "servedName": "qwen"}})))
        await until(lambda: _phase_is(pool_status("pooled"), "CRDAbsent"), what="CRDAbsent in status")
        assert "inference.networking.k8s.io/v1" in (await pool_status("pooled"))["message"]

        await install_pool_crd(real_api)  # no spec change: the sweep publishes the waiting service's pool
        published = await until(lambda: pool("pooled"), what="the pool published once the CRD exists")
        spec = published["spec"]
        assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": "fleetgate-engine",
                                                   "app.kubernetes.io/instance": "pooled"}
        assert spec["targetPorts"] == [{"number": 8000}] and spec["appProtocol"] == "http"
        assert spec["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "fleetgate-epp",
                                             "port": {"number": 9002}, "failureMode": "FailClose"}
        assert not published["metadata"].get("ownerReferences")
        assert published["metadata"]["annotations"]["fleetgate.io/served-model"] == "qwen"
        await until(lambda: _phase_is(pool_status("pooled"), "EndpointPickerMissing"), what="status after publishing")

        await real_api._client.patch(isvc, "pooled", {"spec": {"model": {"servedName": "qwen-7b"}}},
                                     namespace="default", patch_type=_merge())
        await until(lambda: _annotation_is(pool("pooled"), "qwen-7b"), what="the pool updated with the service")

        # the real API server's own validation of the published shape: its CEL rule refuses a Service ref without
        # a port, which the operator never writes
        broken = {**published, "metadata": {"name": "broken", "namespace": "default"},
                  "spec": {**spec, "endpointPickerRef": {"kind": "Service", "name": "x"}}}
        with pytest.raises(Exception) as refused:
            await real_api._client.create(pools.from_dict(broken))
        assert status_code(refused.value) == 422 and "port is required" in str(refused.value)

        await real_api._client.delete(isvc, "pooled", namespace="default")
        await until(lambda: _is_none(pool("pooled")), what="the pool deleted with its service")


async def _phase_is(status: Awaitable[dict[str, Any]], phase: str) -> bool:
    return (await status).get("phase") == phase


async def _annotation_is(pool: Awaitable[dict[str, Any] | None], served: str) -> bool:
    found = await pool
    return bool(found) and found["metadata"]["annotations"]["fleetgate.io/served-model"] == served  # type: ignore[index]


async def _is_none(value: Awaitable[Any]) -> bool:
    return await value is None


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE
