"""Least-privilege RBAC for the operator, written once as data and shared with the Helm chart.

`RULES` is what the operator needs, and nothing more: the reconciler's own calls (`kube.API_CALLS`; a
server-side apply that creates an object also needs `create`) plus Kopf's (watching InferenceServices and
engine Deployments, progress annotations on InferenceServices, Events, peering, resource discovery). The
chart renders `cluster_role()` (or `rules_as_yaml()`); `tests/unit/test_operator_rbac.py` checks that the
rules grant every call the operator can make, and the kmock suite checks every call it did make.
"""

from __future__ import annotations

from typing import Any

from fleetgate.engine.kube_names import GROUP, PLURAL, POOL_GROUP, POOL_PLURAL

_CHILD = ("get", "list", "watch", "create", "patch", "delete")
_READ = ("get", "list", "watch")

RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": (GROUP,), "resources": (PLURAL,), "verbs": ("get", "list", "watch", "patch")},
    {"apiGroups": (GROUP,), "resources": (f"{PLURAL}/status",), "verbs": ("get", "patch")},
    # Children carry ownerReferences with blockOwnerDeletion: clusters that enforce owner-reference
    # permissions (OwnerReferencesPermissionEnforcement, on by default on OpenShift) require this.
    {"apiGroups": (GROUP,), "resources": (f"{PLURAL}/finalizers",), "verbs": ("update",)},
    {"apiGroups": ("apps",), "resources": ("deployments",), "verbs": _CHILD},
    {"apiGroups": ("",), "resources": ("services",), "verbs": _CHILD},
    {"apiGroups": ("policy",), "resources": ("poddisruptionbudgets",), "verbs": _CHILD},
    {"apiGroups": ("autoscaling",), "resources": ("horizontalpodautoscalers",), "verbs": _CHILD},
    {"apiGroups": ("keda.sh",), "resources": ("scaledobjects",), "verbs": _CHILD},
    {"apiGroups": ("monitoring.coreos.com",), "resources": ("servicemonitors",), "verbs": _CHILD},
    # InferencePools published for InferenceServices (Gateway API Inference Extension), deleted when they go.
    {"apiGroups": (POOL_GROUP,), "resources": (POOL_PLURAL,), "verbs": _CHILD},
    {"apiGroups": ("",), "resources": ("events",), "verbs": ("create",)},
    # Runtime LoRA adapters: find the ready engine pods (their IPs) to load adapters into. Read only.
    {"apiGroups": ("",), "resources": ("pods",), "verbs": ("list",)},
    {"apiGroups": ("apiextensions.k8s.io",), "resources": ("customresourcedefinitions",), "verbs": _READ},
    {"apiGroups": ("",), "resources": ("namespaces",), "verbs": ("list", "watch")},
    {"apiGroups": ("kopf.dev",), "resources": ("clusterkopfpeerings",), "verbs": (*_READ, "patch", "create")},
)  # fmt: skip

# The gateway's Kubernetes discovery reads; scale from zero (`fleetgate.gateway.wake`) sets replicas through
# the scale subresource and stamps the last-request annotation the operator's idle scale-down reads.
GATEWAY_RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": (GROUP,), "resources": (PLURAL,), "verbs": ("get", "list", "watch", "patch")},
    {"apiGroups": (GROUP,), "resources": (f"{PLURAL}/scale",), "verbs": ("patch",)},
    {"apiGroups": ("discovery.k8s.io",), "resources": ("endpointslices",), "verbs": ("get", "list", "watch")},
)

# The Endpoint Picker's `inferencepool` discovery (`fleetgate.gateway.discovery.inferencepool`): read only.
EPP_RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": (POOL_GROUP,), "resources": (POOL_PLURAL,), "verbs": ("get", "list", "watch")},
    {"apiGroups": ("",), "resources": ("pods",), "verbs": ("get", "list", "watch")},
)


def allows(*, group: str, resource: str, verb: str, rules: tuple[dict[str, tuple[str, ...]], ...] = RULES) -> bool:
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules)


def _plain(rules: tuple[dict[str, tuple[str, ...]], ...]) -> list[dict[str, list[str]]]:
    return [{key: list(values) for key, values in rule.items()} for rule in rules]


def _rules(*, gateway: bool, epp: bool) -> tuple[dict[str, tuple[str, ...]], ...]:
    return EPP_RULES if epp else GATEWAY_RULES if gateway else RULES


def cluster_role(*, name: str = "fleetgate-operator", gateway: bool = False, epp: bool = False) -> dict[str, Any]:
    """A ClusterRole manifest with the operator's (or the gateway's, or the Endpoint Picker's) rules."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "fleetgate"}},
        "rules": _plain(_rules(gateway=gateway, epp=epp)),
    }


def rules_as_yaml(*, gateway: bool = False, epp: bool = False) -> str:
    import yaml

    return yaml.safe_dump(_plain(_rules(gateway=gateway, epp=epp)), sort_keys=False)
