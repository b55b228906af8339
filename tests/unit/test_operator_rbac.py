"""RBAC is least privilege and complete: every call the API module can issue is granted, nothing else."""

from __future__ import annotations

import kubernetes_validate

from fleetgate.operator.kube import API_CALLS
from fleetgate.operator.rbac import GATEWAY_RULES, RULES, allows, cluster_role


def test_every_declared_api_call_is_granted() -> None:
    for group, resource, verb in API_CALLS:
        assert allows(group=group, resource=resource, verb=verb), (group, resource, verb)
        if verb == "patch" and not resource.endswith("/status") and resource != "inferenceservices":
            # server-side apply creates missing objects: that needs `create` too
            assert allows(group=group, resource=resource, verb="create"), (group, resource)


def test_no_wildcards_and_no_secrets() -> None:
    for rule in RULES + GATEWAY_RULES:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key]
        assert "secrets" not in rule["resources"] and "pods/exec" not in rule["resources"]


def test_operator_never_deletes_or_creates_inference_services() -> None:
    assert not allows(group="fleetgate.io", resource="inferenceservices", verb="delete")
    assert not allows(group="fleetgate.io", resource="inferenceservices", verb="create")
    assert not allows(group="", resource="pods", verb="delete")


def test_gateway_rules_read_and_patch_inference_services_only() -> None:
    for rule in GATEWAY_RULES:
        writes = set(rule["verbs"]) - {"get", "list", "watch"}
        # Scale from zero: the scale subresource and the last-request annotation, nothing else is written.
        assert not writes or (writes == {"patch"} and rule["apiGroups"] == ("fleetgate.io",)), rule
    assert allows(group="discovery.k8s.io", resource="endpointslices", verb="watch", rules=GATEWAY_RULES)
    assert allows(group="fleetgate.io", resource="inferenceservices/scale", verb="patch", rules=GATEWAY_RULES)
    assert allows(group="fleetgate.io", resource="inferenceservices", verb="patch", rules=GATEWAY_RULES)
    assert not allows(group="fleetgate.io", resource="inferenceservices", verb="delete", rules=GATEWAY_RULES)


def test_cluster_role_manifests_are_valid() -> None:
    for gateway in (False, True):
        kubernetes_validate.validate(cluster_role(gateway=gateway), "1.33.0", strict=True)
