"""Runtime LoRA adapters against kmock with faked engine pods: spec.adapters changes load and unload adapters on
every ready pod, a failed load is a condition and an Event, and no adapter change rolls the Deployment."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from fleetgate.engine.kube_names import ANNOTATION_SPEC_HASH
from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.rbac import allows
from fleetgate.operator.settings import OperatorSettings

from .conftest import Cluster, FakePods, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]

POD_A, POD_B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
LORA: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ", "servedName": "qwen"},
    "engine": {"quantization": "awq_marlin", "maxModelLen": 8192, "maxNumSeqs": 24, "maxAdapters": 2,
               "maxLoraRank": 32},
    "resources": {"accelerator": "nvidia-l4", "gpus": 1},
    "replicas": 2,
    "adapters": [{"name": "sql", "source": "hf://acme/sql-lora", "rank": 16}],
}  # fmt: skip


def _cr(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fleetgate.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "default"},
        "spec": copy.deepcopy(spec),
    }


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.objects("inferenceservices").get(name, {}).get("status") or {}


def _cond(cluster: Cluster, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in _status(cluster, name).get("conditions") or [] if c["type"] == type_), {})


def _loaded(cluster: Cluster, name: str) -> dict[str, list[str]]:
    return {e["pod"]: e["loaded"] for e in _status(cluster, name).get("adapters") or []}


def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.objects("events").values() if e.get("reason") == reason]


async def _serving(cluster: Cluster, name: str) -> None:
    await cluster.create(_cr(name, LORA))
    await wait_for(lambda: name in cluster.objects("deployments"), what="Deployment")
    await cluster.add_pod(name, f"{name}-a", ip="10.0.0.1")
    await cluster.add_pod(name, f"{name}-b", ip="10.0.0.2")
    await cluster.add_pod(name, f"{name}-c", ip="10.0.0.3", ready=False)  # still loading: left alone
    await cluster.fake_rollout(name, ready=2)


async def test_add_loads_remove_unloads_and_nothing_rolls(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    await _serving(cluster, "qwen")
    both = {"qwen-a": ["sql"], "qwen-b": ["sql"]}
    await wait_for(lambda: _loaded(cluster, "qwen") == both, what="sql loaded on both ready pods")
    assert pods.called("load") == {(POD_A, "sql"), (POD_B, "sql")}
    assert pods.held[POD_A] == {"sql": "acme/sql-lora"}  # hf:// -> the repository id vLLM downloads
    assert (_cond(cluster, "qwen", "AdaptersReady")["status"], _cond(cluster, "qwen", "AdaptersReady")["reason"]) == (
        "True",
        "Loaded",
    )
    deployment = cluster.objects("deployments")["qwen"]
    generation = deployment["metadata"]["generation"]
    spec_hash = deployment["metadata"]["annotations"][ANNOTATION_SPEC_HASH]

    adapters = [*LORA["adapters"], {"name": "legal", "source": "/adapters/legal", "rank": 32}]
    await cluster.patch_spec("qwen", {"adapters": adapters})
    await wait_for(
        lambda: _loaded(cluster, "qwen") == {"qwen-a": ["legal", "sql"], "qwen-b": ["legal", "sql"]},
        what="legal loaded too",
    )
    assert {(POD_A, "legal"), (POD_B, "legal")} <= pods.called("load")
    assert not pods.called("unload")

    await cluster.patch_spec("qwen", {"adapters": adapters[1:]})
    await wait_for(lambda: _loaded(cluster, "qwen") == {"qwen-a": ["legal"], "qwen-b": ["legal"]}, what="sql gone")
    assert pods.called("unload") == {(POD_A, "sql"), (POD_B, "sql")}
    assert pods.held[POD_A] == {"legal": "/adapters/legal"}
    assert all(url != "http://10.0.0.3:8000" for _verb, url, _name in pods.calls)

    await wait_for(lambda: _status(cluster, "qwen").get("observedGeneration") == 3, what="both edits seen")
    after = cluster.objects("deployments")["qwen"]
    assert after["metadata"]["generation"] == generation, "an adapter change rolled the engine pods"
    assert after["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == spec_hash
    assert _status(cluster, "qwen")["phase"] == "Ready"
    pod_lists = [r for r in cluster.server if r.resource is not None and r.resource.plural == "pods"
                 and r.params.get("fieldManager") != "test" and str(r.method.value).upper() == "GET"]  # fmt: skip
    assert pod_lists and allows(group="", resource="pods", verb="list")


async def test_a_pod_that_restarted_without_its_adapters_gets_them_back(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    await _serving(cluster, "qwen")
    await wait_for(lambda: pods.held.get(POD_B) == {"sql": "acme/sql-lora"}, what="loaded")
    pods.held[POD_B] = {}  # the engine container restarted: runtime-loaded adapters are gone
    await cluster.fake_rollout("qwen", ready=1)
    await cluster.fake_rollout("qwen", ready=2)
    await wait_for(lambda: [c for c in pods.calls if c == ("load", POD_B, "sql")] == [("load", POD_B, "sql")] * 2,
                   what="reloaded on the restarted pod")  # fmt: skip
    await wait_for(lambda: pods.held.get(POD_B) == {"sql": "acme/sql-lora"}, what="loaded again")


async def test_a_failed_load_is_a_condition_and_one_event_per_pod(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    pods.fail_load["broken"] = "invalid LoRA: rank 64 > max_lora_rank 32"
    spec = {**LORA, "adapters": [*LORA["adapters"], {"name": "broken", "source": "/adapters/broken"}]}
    await cluster.create(_cr("qwen", spec))
    await wait_for(lambda: "qwen" in cluster.objects("deployments"), what="Deployment")
    await cluster.add_pod("qwen", "qwen-a", ip="10.0.0.1")
    await cluster.add_pod("qwen", "qwen-b", ip="10.0.0.2")
    await cluster.fake_rollout("qwen", ready=2)

    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("status") == "False", what="AdaptersReady")
    condition = _cond(cluster, "qwen", "AdaptersReady")
    assert condition["reason"] == "LoadFailed"
    assert "qwen-a: broken: " in condition["message"] and "max_lora_rank 32" in condition["message"]
    entries = {e["pod"]: e for e in _status(cluster, "qwen")["adapters"]}
    assert entries["qwen-a"]["loaded"] == ["sql"]  # the good adapter still serves
    assert entries["qwen-a"]["failed"][0]["name"] == "broken"
    assert "HTTP 400" in entries["qwen-a"]["failed"][0]["reason"]
    await wait_for(lambda: len(_events(cluster, "AdapterLoadFailed")) == 2, what="one Event per pod")
    assert all(e["type"] == "Warning" for e in _events(cluster, "AdapterLoadFailed"))

    # Later passes with the same failure announce nothing new.
    await cluster.fake_rollout("qwen", ready=2)
    await cluster.patch_spec("qwen", {"engine": {"maxNumSeqs": 20}})
    await wait_for(lambda: _status(cluster, "qwen").get("observedGeneration") == 2, what="second pass")
    await asyncio.sleep(0.3)
    assert len(_events(cluster, "AdapterLoadFailed")) == 2

    # Fixing the spec clears the condition (within the adapter retry delay Kopf may be waiting out).
    await cluster.patch_spec("qwen", {"adapters": LORA["adapters"]})
    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("status") == "True", what="recovered", within=20)
    assert not operator.done()


async def test_an_unreachable_engine_fails_its_adapters_and_the_operator_survives(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    pods.unreachable.add(POD_B)
    await _serving(cluster, "qwen")
    # Serving goes on (Ready); the adapter condition says the rest.
    await wait_for(lambda: _status(cluster, "qwen").get("phase") == "Ready", what="Ready")
    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("status") == "False", what="AdaptersReady")
    entries = {e["pod"]: e for e in _status(cluster, "qwen")["adapters"]}
    assert entries["qwen-a"]["loaded"] == ["sql"] and not entries["qwen-a"]["failed"]
    assert entries["qwen-b"]["failed"][0]["reason"].startswith("engine API: ")
    assert not operator.done()


async def test_without_lora_no_pod_is_asked_and_status_has_no_adapters(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    spec = {k: v for k, v in LORA.items() if k != "adapters"}
    spec["engine"] = {k: v for k, v in LORA["engine"].items() if k not in ("maxAdapters", "maxLoraRank")}
    await cluster.create(_cr("plain", spec))
    await wait_for(lambda: "plain" in cluster.objects("deployments"), what="Deployment")
    await cluster.add_pod("plain", "plain-a", ip="10.0.0.1")
    await cluster.fake_rollout("plain", ready=2)
    await wait_for(lambda: _status(cluster, "plain").get("readyReplicas") == 2, what="ready")
    assert not pods.calls
    assert "adapters" not in _status(cluster, "plain")
    assert not _cond(cluster, "plain", "AdaptersReady")


FAST_RETRY = pytest.mark.parametrize("operator_settings", [OperatorSettings(adapter_retry_s=0.5)], ids=["retry-0.5s"])


@FAST_RETRY
async def test_a_load_that_failed_after_a_deployment_change_is_retried_until_it_loads(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect: with no engine listening yet, the adapter went LoadFailed on a Deployment event and stayed so
    until an unrelated edit; retries logged an ERROR each time."""
    pods.unreachable.add(POD_A)
    await cluster.create(_cr("qwen", {**LORA, "replicas": 1}))
    # The create pass is over (no pod yet, nothing failed) before the pod comes: the failure is the
    # Deployment event's to find.
    await wait_for(lambda: _status(cluster, "qwen").get("phase") == "Pending", what="created")
    await asyncio.sleep(1)  # kmock has no resourceVersions: Kopf may replay the creation once or twice first
    await cluster.add_pod("qwen", "qwen-a", ip="10.0.0.1")
    await cluster.fake_rollout("qwen", ready=1)  # the Deployment event: its pass finds no engine answering
    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("reason") == "LoadFailed", what="LoadFailed")
    generation = cluster.objects("inferenceservices")["qwen"]["metadata"]["generation"]

    pods.unreachable.clear()  # the engine at the pod IP now answers; nothing in the cluster changes
    await wait_for(lambda: _loaded(cluster, "qwen") == {"qwen-a": ["sql"]}, within=5, what="loaded by a retry")
    assert _cond(cluster, "qwen", "AdaptersReady")["status"] == "True"
    assert cluster.objects("inferenceservices")["qwen"]["metadata"]["generation"] == generation
    assert len(_events(cluster, "AdapterLoadFailed")) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not errors, errors


@FAST_RETRY
async def test_no_ready_pod_seen_while_the_deployment_reports_one_is_looked_at_again(
    cluster: Cluster, operator: EmbeddedOperator, pods: FakePods
) -> None:
    """Defect: AdaptersReady stayed NoReadyPods with 1/1 ready when the pod's own Ready came after the
    Deployment's event; nothing else changed, so nothing looked again."""
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    await cluster.create(_cr("qwen", {**LORA, "replicas": 1}))
    await wait_for(lambda: _status(cluster, "qwen").get("phase") == "Pending", what="created")
    await asyncio.sleep(1)  # as above: the creation is over
    await cluster.add_pod("qwen", "qwen-a", ip="10.0.0.1", ready=False)
    await cluster.fake_rollout("qwen", ready=1)
    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("reason") == "NoReadyPods", what="NoReadyPods")
    await asyncio.sleep(1)  # whatever that status write set off in Kopf is over
    ready = {"status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}
    await cluster.api._client.patch(Pod.Status, "qwen-a", ready, namespace="default", patch_type=PatchType.MERGE)
    await wait_for(lambda: _cond(cluster, "qwen", "AdaptersReady").get("reason") == "Loaded", within=5, what="Loaded")
