"""End to end in a real cluster (KUBECONFIG) with the operator deployed by the Helm chart.

Skipped, and the skip says it did not run, when KUBECONFIG is not set.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetgate.operator.kube import KubeApi, resource_class, status_code

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]


def _cr(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip


SMALL = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"}}


@pytest.fixture
async def e2e_isvc() -> AsyncIterator[tuple[KubeApi, str]]:
    """A name for the test's InferenceService, deleted afterwards whether the test passed or failed."""
    api = KubeApi.from_env(field_manager="fleetgate-e2e")
    name = f"e2e-{int(time.time())}"
    try:
        yield api, name
    finally:
        isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
        try:
            await api._client.delete(isvc, name, namespace="default")
        except Exception as exc:  # already gone, or never created: nothing leaks either way
            if status_code(exc) != 404:
                raise
        finally:
            await api.aclose()


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="not run: KUBECONFIG is not set (end-to-end tier)")
async def test_end_to_end_in_a_cluster(e2e_isvc: tuple[KubeApi, str]) -> None:
    api, name = e2e_isvc
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    await api._client.create(isvc.from_dict(_cr(name, SMALL)))
    deadline = time.monotonic() + 120
    while ((await api.get_inference_service(namespace="default", name=name)) or {}).get("status", {}).get(
        "phase"
    ) is None:
        assert time.monotonic() < deadline, "the operator in the cluster wrote no status within 120 s"
        await asyncio.sleep(1)
