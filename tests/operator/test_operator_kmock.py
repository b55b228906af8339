"""The operator end to end against kmock: create, become ready, update, scale, invalid spec, no fit, delete."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.operator.embedded import EmbeddedOperator
from fleetgate.operator.kube import API_CALLS
from fleetgate.operator.rbac import allows

from .conftest import Cluster, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _cr(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fleetgate.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "default"},
        "spec": copy.deepcopy(spec),
    }


SMALL: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ", "servedName": "qwen"},
    "engine": {"quantization": "awq_marlin", "maxModelLen": 8192, "maxNumSeqs": 24},
    "resources": {"accelerator": "nvidia-l4", "gpus": 1},
    "replicas": 1,
}


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.objects("inferenceservices").get(name, {}).get("status") or {}


def _cond(cluster: Cluster, name: str, type_: str) -> tuple[str, str] | None:
    for c in _status(cluster, name).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.objects("events").values() if e.get("reason") == reason]


async def test_create_then_ready_then_update_then_scale(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await cluster.create(_cr("qwen", SMALL))
    await wait_for(lambda: _status(cluster, "qwen").get("phase") == "Pending", what="Pending status")
    dep = cluster.objects("deployments")["qwen"]
    isvc = cluster.objects("inferenceservices")["qwen"]
    assert dep["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
    assert set(cluster.objects("services")) == {"qwen"} and set(cluster.objects("poddisruptionbudgets")) == {"qwen"}
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--served-model-name") + 1] == "qwen"
    assert _cond(cluster, "qwen", "CapacityPlanned") == ("True", "Fits")
    assert _status(cluster, "qwen")["endpoint"] == "http://qwen.default.svc.cluster.local:8000"

    await cluster.fake_rollout("qwen", ready=1)
    await wait_for(lambda: _status(cluster, "qwen").get("phase") == "Ready", what="Ready after the pods are ready")
    assert _cond(cluster, "qwen", "Ready") == ("True", "AllReplicasReady")
    assert _status(cluster, "qwen")["ready"] == "1/1"

    await cluster.patch_spec("qwen", {"engine": {"maxNumSeqs": 16}})

    def updated() -> bool:
        argv = cluster.objects("deployments")["qwen"]["spec"]["template"]["spec"]["containers"][0]["args"]
        return argv[argv.index("--max-num-seqs") + 1] == "16"

    # Applied at once, although the create handler is waiting out a retry delay for the pods.
    await wait_for(updated, within=5, what="Deployment args updated")
    await wait_for(lambda: _status(cluster, "qwen").get("observedGeneration") == 2, what="observedGeneration 2")

    await cluster.patch_spec("qwen", {"replicas": 3})
    await wait_for(
        lambda: cluster.objects("deployments")["qwen"]["spec"].get("replicas") == 3,
        within=5,
        what="scaled to 3",
    )
    await cluster.fake_rollout("qwen", ready=3)
    await wait_for(lambda: _status(cluster, "qwen").get("ready") == "3/3", what="3/3 ready")


async def test_invalid_spec_sets_condition_and_event_and_operator_survives(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    bad = copy.deepcopy(SMALL)
    bad["engine"]["tensorParallelSize"] = 4  # but gpus: 1
    await cluster.create(_cr("bad", bad))
    await wait_for(lambda: _status(cluster, "bad").get("phase") == "Invalid", what="Invalid status")
    assert _cond(cluster, "bad", "Degraded") == ("True", "InvalidSpec")
    message = next(c["message"] for c in _status(cluster, "bad")["conditions"] if c["type"] == "Degraded")
    assert "tensorParallelSize" in message
    await wait_for(lambda: bool(_events(cluster, "InvalidSpec")), what="InvalidSpec event")
    assert "bad" not in cluster.objects("deployments")
    # The operator keeps working for everyone else.
    await cluster.create(_cr("good", SMALL))
    await wait_for(lambda: "good" in cluster.objects("deployments"), what="children of a valid CR")
    assert not operator.done()


async def test_spec_that_does_not_fit_creates_no_pods(cluster: Cluster, operator: EmbeddedOperator) -> None:
    doc = yaml.safe_load((EXAMPLES / "does-not-fit.yaml").read_text())
    doc["metadata"]["namespace"] = "default"  # as `kubectl apply -n default -f` does
    await cluster.create(doc)
    await wait_for(lambda: _status(cluster, "too-big").get("phase") == "DoesNotFit", what="DoesNotFit status")
    assert _cond(cluster, "too-big", "CapacityPlanned") == ("False", "DoesNotFit")
    assert "too-big" not in cluster.objects("deployments")
    # No engine, so no Service and no endpoint to advertise (defect: both were there).
    assert "too-big" not in cluster.objects("services")
    assert _status(cluster, "too-big").get("endpoint") is None
    await wait_for(lambda: bool(_events(cluster, "DoesNotFit")), what="DoesNotFit event")
    assert "141.10 GB weights" in _events(cluster, "DoesNotFit")[0]["message"]


async def test_autoscaler_added_and_removed(cluster: Cluster, operator: EmbeddedOperator) -> None:
    spec = {**copy.deepcopy(SMALL), "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    await cluster.create(_cr("auto", spec))
    await wait_for(lambda: "auto" in cluster.objects("horizontalpodautoscalers"), what="HPA")
    assert "replicas" not in cluster.objects("deployments")["auto"]["spec"]
    # `kubectl scale fgis/auto --replicas 3` (spec.replicas) is honoured: the autoscaler's floor rises.
    await cluster.patch_spec("auto", {"replicas": 3})
    await wait_for(
        lambda: cluster.objects("horizontalpodautoscalers")["auto"]["spec"]["minReplicas"] == 3,
        within=5,
        what="HPA floor raised by kubectl scale",
    )
    await cluster.patch_spec("auto", {"autoscaling": None})
    await wait_for(lambda: "auto" not in cluster.objects("horizontalpodautoscalers"), within=5, what="HPA deleted")


async def test_deletion_is_clean(cluster: Cluster, operator: EmbeddedOperator) -> None:
    await cluster.create(_cr("gone", SMALL))
    await wait_for(lambda: "gone" in cluster.objects("deployments"), what="children")
    await cluster.delete("gone")
    await wait_for(lambda: "gone" not in cluster.objects("inferenceservices"), what="CR deleted")
    await asyncio.sleep(0.3)
    assert not operator.done()
    # Children go with their owner through the API server's garbage collector (not emulated by kmock):
    for plural in ("deployments", "services", "poddisruptionbudgets"):
        refs = cluster.objects(plural)["gone"]["metadata"]["ownerReferences"]
        assert refs[0]["kind"] == "InferenceService" and refs[0]["name"] == "gone" and refs[0]["blockOwnerDeletion"]


async def test_every_request_the_operator_made_is_granted_by_rbac(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    await cluster.create(_cr("rbac", SMALL))
    await wait_for(lambda: _status(cluster, "rbac").get("phase") == "Pending", what="reconciled")
    await cluster.fake_rollout("rbac", ready=1)
    await wait_for(lambda: _status(cluster, "rbac").get("phase") == "Ready", what="ready")
    verbs = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
    checked = 0
    for request in cluster.server:
        res = request.resource
        if res is None or res.plural is None:  # discovery: granted to every authenticated client
            continue
        if request.params.get("fieldManager") == "test":  # the test's own client, not the operator
            continue
        resource = res.plural + (f"/{request.subresource}" if getattr(request, "subresource", None) else "")
        verb = verbs[str(request.method.value).upper()]
        if verb == "get" and request.name is None:
            verb = "watch" if request.params.get("watch") in ("true", "1") else "list"
        assert allows(group=res.group or "", resource=resource, verb=verb), (res.group, resource, verb, request.url)
        checked += 1
    assert checked > 5
    assert API_CALLS  # the declared list is what test_operator_rbac checks statically


async def test_children_carrying_block_owner_deletion_are_allowed_by_rbac(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    """OwnerReferencesPermissionEnforcement: setting blockOwnerDeletion needs `update` on the owner's
    finalizers; without it a real API server refuses every child (kmock does not enforce it)."""
    await cluster.create(_cr("owned", SMALL))
    await wait_for(lambda: "owned" in cluster.objects("poddisruptionbudgets"), what="children")
    for plural in ("deployments", "services", "poddisruptionbudgets"):
        (ref,) = cluster.objects(plural)["owned"]["metadata"]["ownerReferences"]
        assert ref["blockOwnerDeletion"]
        group = ref["apiVersion"].split("/")[0]
        assert allows(group=group, resource="inferenceservices/finalizers", verb="update"), plural


@pytest.mark.parametrize("plural", ["services", "poddisruptionbudgets", "deployments"])
async def test_a_deleted_child_is_recreated_and_status_does_not_stay_ready(
    cluster: Cluster, operator: EmbeddedOperator, plural: str
) -> None:
    from fleetgate.operator.kube import resource_class

    kinds = {"services": ("", "v1", "Service"), "poddisruptionbudgets": ("policy", "v1", "PodDisruptionBudget"),
             "deployments": ("apps", "v1", "Deployment")}  # fmt: skip
    await cluster.create(_cr("heal", SMALL))
    await wait_for(lambda: "heal" in cluster.objects("deployments"), what="children")
    await cluster.fake_rollout("heal", ready=1)
    await wait_for(lambda: _status(cluster, "heal").get("phase") == "Ready", what="Ready")
    old_uid = cluster.objects(plural)["heal"]["metadata"]["uid"]
    group, version, kind = kinds[plural]
    await cluster.api._client.delete(resource_class(group, version, kind, plural), "heal", namespace="default")
    await wait_for(
        lambda: cluster.objects(plural).get("heal", {}).get("metadata", {}).get("uid") not in (None, old_uid),
        within=5,
        what=f"{plural}/heal recreated",
    )
    if plural == "deployments":  # a fresh Deployment has no ready pods: status must say so
        await wait_for(lambda: _status(cluster, "heal").get("phase") == "Pending", within=5, what="not Ready")


@pytest.mark.parametrize("name", ["qwen2.5-7b", "a" * 64])
async def test_a_name_children_cannot_use_is_invalid_once_not_an_error_loop(
    cluster: Cluster, operator: EmbeddedOperator, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    await cluster.create(_cr(name, SMALL))
    await wait_for(lambda: _status(cluster, name).get("phase") == "Invalid", what="Invalid status")
    message = next(c["message"] for c in _status(cluster, name)["conditions"] if c["type"] == "Degraded")
    assert "metadata.name" in message and ("DNS-1035" in message or "at most 63" in message)
    await wait_for(lambda: bool(_events(cluster, "InvalidSpec")), what="InvalidSpec event")
    assert not cluster.objects("deployments") and not cluster.objects("services")
    await asyncio.sleep(0.5)
    assert len(_events(cluster, "InvalidSpec")) == 1
    assert not [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("kopf.objects")]


async def test_one_capacity_event_per_edit_and_waiting_is_not_an_error(
    cluster: Cluster, operator: EmbeddedOperator, caplog: pytest.LogCaptureFixture
) -> None:
    await cluster.create(_cr("once", SMALL))
    await wait_for(lambda: len(_events(cluster, "CapacityPlanned")) == 1, what="first CapacityPlanned")
    await cluster.patch_spec("once", {"engine": {"maxModelLen": 4096}})
    await wait_for(lambda: _status(cluster, "once").get("observedGeneration") == 2, what="edit reconciled")
    await wait_for(lambda: len(_events(cluster, "CapacityPlanned")) == 2, what="second CapacityPlanned")
    await asyncio.sleep(0.5)
    assert len(_events(cluster, "CapacityPlanned")) == 2, [e["message"] for e in _events(cluster, "CapacityPlanned")]
    assert not [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("kopf")], "waiting is normal"


@pytest.mark.parametrize(
    ("name", "source", "engine", "resources", "expected"),
    [
        ("llama-tp3", "hf://meta-llama/Llama-3.1-70B-Instruct", {"tensorParallelSize": 3},
         {"accelerator": "nvidia-h100-80gb", "gpus": 3}, "does not divide the model's 64 attention heads"),
        ("idle-gpu", "hf://Qwen/Qwen2.5-7B-Instruct", {"tensorParallelSize": 2},
         {"accelerator": "nvidia-l4", "gpus": 4}, "set resources.gpus to 2"),
    ],
)  # fmt: skip
async def test_specs_vllm_would_refuse_are_invalid_with_no_pods(
    cluster: Cluster,
    operator: EmbeddedOperator,
    name: str,
    source: str,
    engine: dict[str, Any],
    resources: dict[str, Any],
    expected: str,
) -> None:
    await cluster.create(_cr(name, {"model": {"source": source}, "engine": engine, "resources": resources}))
    await wait_for(lambda: _status(cluster, name).get("phase") == "Invalid", what="Invalid status")
    message = next(c["message"] for c in _status(cluster, name)["conditions"] if c["type"] == "Degraded")
    assert expected in message
    await wait_for(lambda: expected in " ".join(e["message"] for e in _events(cluster, "InvalidSpec")), what="Event")
    assert name not in cluster.objects("deployments")
