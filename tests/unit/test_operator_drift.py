"""Drift: which fields the operator applied read back changed, and which differences are not drift."""

from __future__ import annotations

import copy
from typing import Any

from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.drift import drift, quantity
from fleetgate.operator.plan import plan
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec

OWNER = Owner(name="qwen", namespace="default", uid="uid-1")
SPEC = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"},
        "resources": {"accelerator": "nvidia-l4", "gpus": 1}}  # fmt: skip


def _children(spec: dict[str, Any] = SPEC) -> dict[str, dict[str, Any]]:
    settings = OperatorSettings()
    parsed = parse_spec(spec)
    resolved = resolve(spec=parsed, name=OWNER.name, profiles=settings.profiles)
    return {c["kind"]: c for c in build_children(owner=OWNER, spec=parsed, resolved=resolved, settings=settings)}


def _as_stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: defaults added, empty booleans omitted, quantities canonical, status set."""
    live = copy.deepcopy(manifest)
    live["metadata"].update(uid="child-uid", resourceVersion="7", managedFields=[{"manager": "fleetgate-operator"}])
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    live["status"] = {"readyReplicas": 1}
    spec = live["spec"]
    if live["kind"] == "Service":
        spec.update(clusterIP="10.96.0.7", sessionAffinity="None", ipFamilies=["IPv4"])
        del spec["publishNotReadyAddresses"]  # false is omitted when read back
    if live["kind"] == "Deployment":
        spec["revisionHistoryLimit"] = 10
        pod = spec["template"]["spec"]
        pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
        container = pod["containers"][0]
        container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        container["resources"]["requests"]["cpu"] = "4000m"  # same quantity, other spelling
        container["startupProbe"]["successThreshold"] = 1
    return live


def test_a_child_as_the_api_server_returns_it_has_no_drift() -> None:
    for manifest in _children().values():
        assert drift(desired=manifest, live=_as_stored(manifest)) == [], manifest["kind"]


def test_kubectl_scale_set_image_and_patch_svc_are_drift_named_by_field() -> None:
    children = _children()
    deployment = _as_stored(children["Deployment"])
    deployment["spec"]["replicas"] = 3
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "evil/image:1"
    found = [d.describe() for d in drift(desired=children["Deployment"], live=deployment)]
    assert found == ["spec.replicas (was 3)", "spec.template.spec.containers[engine].image (was 'evil/image:1')"]
    service = _as_stored(children["Service"])
    service["spec"]["ports"][0]["port"] = 9000
    assert [d.path for d in drift(desired=children["Service"], live=service)] == ["spec.ports[http].port"]


def test_what_others_own_is_not_drift_but_what_the_operator_owns_is() -> None:
    children = _children()
    live = _as_stored(children["Deployment"])
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "ADDED_BY_SOMEONE", "value": "1"})  # another manager's env var
    live["metadata"]["labels"]["team"] = "ml"  # an extra label
    assert drift(desired=children["Deployment"], live=live) == []
    container["args"] = [*container["args"], "--evil"]  # args are an atomic list: the whole list is ours
    del live["metadata"]["ownerReferences"]
    container["env"] = [e for e in container["env"] if e["name"] != "HF_HOME"]
    paths = [d.path for d in drift(desired=children["Deployment"], live=live)]
    assert paths == ["metadata.ownerReferences[qwen]", "spec.template.spec.containers[engine].args",
                     "spec.template.spec.containers[engine].env[HF_HOME]"]  # fmt: skip


def test_an_autoscaled_deployment_never_drifts_on_replicas() -> None:
    """The HPA owns replicas: the applied Deployment has none, so no value the HPA sets is drift."""
    children = _children({**SPEC, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})
    live = _as_stored(children["Deployment"])
    live["spec"]["replicas"] = 4
    assert "replicas" not in children["Deployment"]["spec"]
    assert drift(desired=children["Deployment"], live=live) == []


def test_plan_updates_a_drifted_child_and_keeps_the_others() -> None:
    children = _children()
    observed = [_as_stored(c) for c in children.values()]
    for obj in observed:
        obj["metadata"]["ownerReferences"][0]["uid"] = OWNER.uid
    assert {a.verb for a in plan(desired=list(children.values()), observed=observed, owner_uid=OWNER.uid)} == {"keep"}
    next(o for o in observed if o["kind"] == "Deployment")["spec"]["replicas"] = 3
    actions = {a.kind: a for a in plan(desired=list(children.values()), observed=observed, owner_uid=OWNER.uid)}
    assert actions["Deployment"].verb == "update" and actions["Deployment"].drift == ("spec.replicas (was 3)",)
    assert actions["Deployment"].manifest is children["Deployment"]
    assert actions["Service"].verb == "keep" and actions["PodDisruptionBudget"].verb == "keep"


def test_quantities_compare_by_value() -> None:
    assert quantity("1") == quantity("1000m") and quantity("0.5") == quantity("500m")
    assert quantity("16Gi") == 16 * 2**30 and quantity("1e3") == quantity("1k")
    assert quantity("hf://org/model") is None and quantity("evil/image:1") is None
