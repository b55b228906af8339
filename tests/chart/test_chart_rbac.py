"""RBAC: least privilege, scoped to the watched namespaces, bound to the chart's own ServiceAccounts."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.operator.rbac import GATEWAY_RULES, RULES, rules_as_yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "fleetgate"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}
RULE_FILES = {"operator-rbac.yaml": False, "gateway-rbac.yaml": True}


def _triples(rules: Any) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize(("filename", "gateway"), RULE_FILES.items())
def test_rule_files_are_generated_from_operator_rbac(filename: str, gateway: bool) -> None:
    text = (CHART_DIR / "files" / filename).read_text()
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    flag = "gateway=True" if gateway else ""
    assert body == rules_as_yaml(gateway=gateway), (
        f"charts/fleetgate/files/{filename} is stale; regenerate it with\n  PYTHONSAFEPATH=1 .venv/bin/python -c "
        f"\"from fleetgate.operator.rbac import rules_as_yaml; import sys; sys.stdout.write(rules_as_yaml({flag}))\" "
        f"> body.yaml  # then keep the two header comment lines"
    )


@pytest.mark.parametrize(
    "mode", [(), ("operator.watchNamespaces={team-a,team-b}",), ("operator.watchAllNamespaces=true",)]
)
def test_rendered_operator_roles_grant_exactly_operator_rbac(chart: Any, mode: tuple[str, ...]) -> None:
    rendered = chart.render(set_values=list(mode))
    cluster = [r for c in rendered.component("ClusterRole", "operator") for r in c["rules"]]
    roles = rendered.component("Role", "operator")
    for role in roles:
        assert _triples(cluster) | _triples(role["rules"]) == _triples(RULES), role["metadata"]["namespace"]
        assert not {r for rule in role["rules"] for r in rule["resources"]} & CLUSTER_SCOPED, (
            "a Role cannot grant cluster-scoped resources"
        )
    if roles:
        leaked = {r for rule in cluster for r in rule["resources"]} - CLUSTER_SCOPED
        assert not leaked, f"namespaced rights granted cluster-wide: {leaked}"
    else:
        assert _triples(cluster) == _triples(RULES)


def test_rendered_gateway_role_grants_exactly_gateway_rules(chart: Any) -> None:
    (role,) = chart.render().component("Role", "gateway")
    assert _triples(role["rules"]) == _triples(GATEWAY_RULES)
    assert yaml.safe_load(rules_as_yaml(gateway=True)) == role["rules"]


def _crd_group_plural(chart: Any) -> tuple[str, str]:
    (crd,) = [c for c in chart.render(extra=["--include-crds"]).of_kind("CustomResourceDefinition")
              if c["spec"]["names"]["kind"] == "InferenceService"]
    return crd["spec"]["group"], crd["spec"]["names"]["plural"]


def _grants(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            verbs |= set(rule["verbs"])
    return verbs


def test_no_wildcards_anywhere(chart: Any, scenario: Path) -> None:
    rendered = chart.render(values=[scenario])
    for role in rendered.of_kind("Role") + rendered.of_kind("ClusterRole"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']} grants * in {field}"


def test_bindings_point_at_rendered_roles_and_service_accounts(chart: Any, scenario: Path) -> None:
    rendered = chart.render(values=[scenario])
    for binding in rendered.of_kind("RoleBinding") + rendered.of_kind("ClusterRoleBinding"):
        ref = binding["roleRef"]
        # A RoleBinding can only grant a Role of its own namespace.
        rendered.get(ref["kind"], ref["name"], binding["metadata"].get("namespace"))
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            sa = rendered.get("ServiceAccount", subject["name"], subject["namespace"])
            assert sa["metadata"]["labels"]["app.kubernetes.io/component"] == (
                binding["metadata"]["labels"]["app.kubernetes.io/component"]
            )


def test_gateway_reads_only_what_discovery_needs(chart: Any, scenario: Path) -> None:
    group, plural = _crd_group_plural(chart)
    rendered = chart.render(values=[scenario])
    assert not rendered.component("ClusterRole", "gateway"), "the gateway needs nothing cluster-wide"
    for role in rendered.component("Role", "gateway"):
        # patch: the last-request annotation and, on the scale subresource, scale from zero.
        assert _grants(role["rules"], group, plural) == {"get", "list", "watch", "patch"}
        assert _grants(role["rules"], group, f"{plural}/scale") == {"patch"}
        assert _grants(role["rules"], "discovery.k8s.io", "endpointslices") == {"get", "list", "watch"}
        for rule in role["rules"]:
            if rule["apiGroups"] != [group]:
                assert not WRITE_VERBS & set(rule["verbs"]), "the gateway writes only to InferenceServices"
            assert not {"create", "delete", "update"} & set(rule["verbs"])
            assert "secrets" not in rule["resources"]


def test_operator_roles_follow_the_watched_namespaces(chart: Any) -> None:
    group, plural = _crd_group_plural(chart)

    def operator_roles(*args: str) -> tuple[dict[str, set[str]], list[dict[str, Any]]]:
        rendered = chart.render(set_values=list(args))
        roles = {r["metadata"]["namespace"]: _grants(r["rules"], group, plural)
                 for r in rendered.component("Role", "operator")}
        return roles, rendered.component("ClusterRole", "operator")

    roles, cluster = operator_roles()
    assert set(roles) == {"fleet"} and {"get", "list", "watch"} <= roles["fleet"]
    assert all(not _grants(c["rules"], group, plural) for c in cluster), "CR access leaks cluster-wide"

    roles, cluster = operator_roles("operator.watchNamespaces={team-a,team-b}")
    assert set(roles) == {"team-a", "team-b"}
    assert all(not _grants(c["rules"], group, plural) for c in cluster)

    roles, cluster = operator_roles("operator.watchAllNamespaces=true")
    assert roles == {}
    assert any({"get", "list", "watch"} <= _grants(c["rules"], group, plural) for c in cluster)


def test_gateway_discovery_follows_the_operator(chart: Any) -> None:
    def namespaces(*args: str) -> list[str]:
        return [r["metadata"]["namespace"] for r in chart.render(set_values=list(args)).component("Role", "gateway")]

    assert namespaces() == ["fleet"]
    assert namespaces("operator.watchNamespaces={team-a,team-b}") == ["team-a"]
    assert namespaces("operator.watchNamespaces={team-a,team-b}", "gateway.discovery.namespace=team-b") == ["team-b"]


def _scopes(chart: Any) -> dict[tuple[str, str], bool]:
    """(group, plural) -> namespaced, from a Kubernetes discovery dump (kmock ships one for the built-in
    APIs) and the chart's own CRDs."""
    raw = (resources.files("kmock._internal") / "resources.json.gz").read_bytes()
    out: dict[tuple[str, str], bool] = {}
    for api in json.loads(gzip.decompress(raw)):
        group = api["groupVersion"].rpartition("/")[0]
        for res in api["resources"]:
            out[(group, res["name"])] = bool(res["namespaced"])
    for crd in chart.render(extra=["--include-crds"]).of_kind("CustomResourceDefinition"):
        out[(crd["spec"]["group"], crd["spec"]["names"]["plural"])] = crd["spec"]["scope"] == "Namespaced"
    return out


def test_cluster_scoped_resources_go_to_the_cluster_role(chart: Any) -> None:
    """In namespaced mode a Role cannot grant a cluster-scoped resource and a ClusterRole must not grant a
    namespaced one: each resource of RULES lands on the side its API scope says. Resources of third-party
    CRDs missing from both sources (KEDA, Prometheus Operator) are namespaced kinds."""
    scopes = _scopes(chart)
    rendered = chart.render(set_values=["operator.watchNamespaces={team-a}"])
    cluster = _triples(r for c in rendered.component("ClusterRole", "operator") for r in c["rules"])
    (role,) = rendered.component("Role", "operator")
    namespaced = _triples(role["rules"])
    for group, resource, verb in _triples(RULES):
        is_namespaced = scopes.get((group, resource.split("/")[0]), True)
        side, other = (namespaced, cluster) if is_namespaced else (cluster, namespaced)
        assert (group, resource, verb) in side and (group, resource, verb) not in other, (group, resource, verb)
