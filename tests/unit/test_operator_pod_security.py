"""Engine pods meet the restricted Pod Security Standard by default; `spec.pod` sets what a platform needs.

The API server's own PodSecurity admission judges the same templates in the envtest and KUBECONFIG tiers
(tests/operator/test_operator_envtest.py, test_operator_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec

SPEC = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"},
        "resources": {"accelerator": "nvidia-l4", "gpus": 1}}  # fmt: skip


def _template(spec: dict[str, Any], settings: OperatorSettings | None = None) -> dict[str, Any]:
    settings = settings or OperatorSettings()
    parsed = parse_spec(spec)
    resolved = resolve(spec=parsed, name="qwen", profiles=settings.profiles)
    children = build_children(owner=Owner(name="qwen", namespace="ml", uid="u"), spec=parsed, resolved=resolved,
                              settings=settings)  # fmt: skip
    template: dict[str, Any] = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]
    return template


def test_defaults_meet_restricted() -> None:
    pod = _template(SPEC)["spec"]
    (container,) = pod["containers"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000 != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert all(set(v) & {"emptyDir", "persistentVolumeClaim"} for v in pod["volumes"])  # no hostPath
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    # A UID without a home in the image: HOME is a volume, and USER answers getpass.getuser().
    assert env["HOME"] in mounts and env["USER"]


def test_spec_pod_overrides_field_by_field_and_adds_scheduling() -> None:
    spec = {**SPEC, "pod": {
        "securityContext": {"runAsUser": 2000, "seccompProfile": {"type": "Localhost", "localhostProfile": "v.json"}},
        "containerSecurityContext": {"readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"],
                                                                                       "add": ["NET_BIND_SERVICE"]}},
        "serviceAccountName": "engines", "imagePullSecrets": ["regcred"], "priorityClassName": "inference",
        "runtimeClassName": "nvidia", "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "labels": {"team": "ml"}, "annotations": {"prometheus.io/port": "1", "owner": "ml"}}}  # fmt: skip
    template = _template(spec)
    pod = template["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 1000, "fsGroup": 1000,
                                      "seccompProfile": {"type": "Localhost", "localhostProfile": "v.json"}}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}  # fmt: skip
    assert (pod["serviceAccountName"], pod["priorityClassName"], pod["runtimeClassName"]) == (
        "engines", "inference", "nvidia")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-L4"}  # the profile's kept
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"]["owner"] == "ml"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"  # the operator's own win


def test_a_platform_that_assigns_uids_gets_none_set() -> None:
    """OpenShift's restricted SCC gives each namespace a UID range and refuses a fixed runAsUser outside it."""
    security = _template(SPEC, OperatorSettings(engine_run_as_user=None))["spec"]["securityContext"]
    assert security == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("pod", [
    {"labels": {"app.kubernetes.io/instance": "other"}},
    {"securityContext": {"seccompProfile": {"type": "Localhost"}}},
    {"securityContext": {"runAsUser": -1}},
    {"containerSecurityContext": {"capabilities": {"add": ["net_raw"]}}},
    {"serviceAccountName": "Not_A_Name"},
    {"hostNetwork": True},
])  # fmt: skip
def test_spec_pod_refuses_what_would_break_the_pods(pod: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_spec({**SPEC, "pod": pod})
