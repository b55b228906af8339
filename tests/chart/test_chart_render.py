"""The chart lints, renders and produces valid Kubernetes objects for every scenario (ci/*-values.yaml).

Every rendered object, the CRDs in crds/ included, is validated against the Kubernetes OpenAPI schemas shipped in
`kubernetes-validate` (strict: unknown fields fail) for the oldest Kubernetes the chart supports
(Chart.yaml kubeVersion) and for the version of the Helm binary's client. Objects of kinds defined by
the chart's own CRDs (Kopf peerings) are validated against those CRDs' OpenAPI schemas; ServiceMonitor is
checked field by field instead, for the reason stated in NOT_IN_KUBERNETES.
"""

from __future__ import annotations

import copy
import re
import tarfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

CHART_YAML = Path(__file__).resolve().parents[2] / "charts" / "fleetgate" / "Chart.yaml"
# Oldest version allowed by Chart.yaml's kubeVersion, and the helm binary's client version. 1.28: the CRD's
# CEL rules name their field (`fieldPath`, `reason`), which older API servers do not know.
KUBE_VERSIONS = ("1.28", "1.35")
NOT_IN_KUBERNETES = {
    "ServiceMonitor": "a Prometheus Operator CRD (monitoring.coreos.com/v1): kubernetes-validate ships only "
    "Kubernetes' own schemas, so its fields are checked in test_service_monitor_targets_the_gateway",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_chart_metadata() -> None:
    meta = yaml.safe_load(CHART_YAML.read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == "0.1.0"
    assert meta["kubeVersion"].startswith(">=1.28")


def test_lint_strict(chart: Any, scenario: Path) -> None:
    proc = chart.lint(values=[scenario])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout
    assert "[ERROR]" not in proc.stdout


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_objects_match_kubernetes_schemas(chart: Any, scenario: Path, kube_version: str) -> None:
    rendered = chart.render(values=[scenario], extra=["--include-crds"])
    assert "CustomResourceDefinition" in rendered.kinds(), "crds/ not rendered"
    own_kinds = {
        (f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"]): v["schema"]["openAPIV3Schema"]
        for crd in rendered.of_kind("CustomResourceDefinition")
        for v in crd["spec"]["versions"]
    }
    for obj in rendered.objects:
        if obj["kind"] in NOT_IN_KUBERNETES:
            continue
        schema = own_kinds.get((obj["apiVersion"], obj["kind"]))
        if schema is not None:
            jsonschema.validate(obj, schema)
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {where}: "
                        f"{exc.message}")


def test_validator_rejects_a_broken_object(chart: Any) -> None:
    """The schema check above is not vacuous: a misspelt field in a Deployment fails it."""
    deployment = chart.render().component("Deployment", "gateway")[0]
    kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)


def test_names_and_labels_fit_kubernetes_limits(chart: Any) -> None:
    long_release = "a-very-long-release-name-for-a-platform-team-cluster"  # 52 characters
    assert len(long_release) <= 53  # helm's own release-name limit
    rendered = chart.render(release=long_release)
    names = set()
    for obj in rendered.objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and DNS_LABEL.match(name), f"{obj['kind']} name {name!r}"
        names.add((obj["kind"], obj["metadata"].get("namespace"), name))
        for key, value in obj["metadata"].get("labels", {}).items():
            assert len(value) <= 63 and LABEL_VALUE.match(value), f"label {key}={value!r} on {name}"
    assert len(names) == len(rendered.objects), "two objects of one kind share a name"
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in rendered.objects}
    assert {"operator", "gateway", "redis"} <= components


def test_fullname_override_names_every_object(chart: Any) -> None:
    rendered = chart.render(set_values=["fullnameOverride=fleet"])
    for obj in rendered.objects:
        assert obj["metadata"]["name"].startswith("fleet-"), obj["metadata"]["name"]


def test_common_labels_everywhere(chart: Any, scenario: Path) -> None:
    rendered = chart.render(values=[scenario], set_values=["commonLabels.cost-center=ml-platform"])
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["cost-center"] == "ml-platform", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "fg"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_workloads_select_their_own_pods_and_services_find_them(chart: Any, scenario: Path) -> None:
    rendered = chart.render(values=[scenario])
    workloads = rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")
    pod_labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads]
    for w in workloads:
        selector = w["spec"]["selector"]["matchLabels"]
        matching = [labels for labels in pod_labels if selector.items() <= labels.items()]
        assert len(matching) == 1, f"{w['metadata']['name']}'s selector matches {len(matching)} pod templates"
    for svc in rendered.of_kind("Service"):
        sel = svc["spec"]["selector"]
        targets = [w for w in workloads if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)} workloads"
        ports = {p["name"] for c in _pod_spec(targets[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{svc['metadata']['name']} targets missing port {port['targetPort']}"
    for sts in rendered.of_kind("StatefulSet"):
        rendered.get("Service", sts["spec"]["serviceName"])


def test_pods_reference_only_rendered_or_declared_objects(chart: Any, scenario: Path) -> None:
    values = yaml.safe_load(scenario.read_text()) or {}
    external_secret = values.get("gateway", {}).get("apiKeys", {}).get("existingSecret")
    rendered = chart.render(values=[scenario])
    for w in rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet"):
        spec = _pod_spec(w)
        sa = spec.get("serviceAccountName")
        if sa:
            rendered.get("ServiceAccount", sa)
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                rendered.get("ConfigMap", vol["configMap"]["name"])
            if "secret" in vol:
                name = vol["secret"]["secretName"]
                if name != external_secret:
                    secret = rendered.get("Secret", name)
                    keys = {*secret.get("data", {}), *secret.get("stringData", {})}
                    for item in vol["secret"].get("items", []):
                        assert item["key"] in keys, f"Secret {name} lacks key {item['key']}"
        mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        declared = {v["name"] for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        assert mounted <= declared | claims, f"{w['metadata']['name']} mounts undeclared volumes"


def test_containers_are_locked_down(chart: Any, scenario: Path) -> None:
    rendered = chart.render(values=[scenario])
    for w in rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet"):
        spec = _pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "memory" in c["resources"]["limits"], f"{c['name']} has no memory limit"


def test_service_monitor_targets_the_gateway(chart: Any) -> None:
    rendered = chart.render(set_values=["serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom"])
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (service,) = rendered.component("Service", "gateway-metrics")
    (client,) = rendered.component("Service", "gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert not selector.items() <= client["metadata"]["labels"].items()  # the client Service is not scraped
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_gateway_metrics_have_their_own_port_and_cluster_ip_service(chart: Any) -> None:
    """/metrics shows every tenant's spend: never on the client port or the client (maybe public) Service."""
    rendered = chart.render(set_values=["gateway.service.type=LoadBalancer", "gateway.metricsPort=9123"])
    (client,) = rendered.component("Service", "gateway")
    (metrics,) = rendered.component("Service", "gateway-metrics")
    assert [p["targetPort"] for p in client["spec"]["ports"]] == ["http"]
    assert metrics["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [(9123, "metrics")]
    (deployment,) = rendered.component("Deployment", "gateway")
    pod = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["metrics"] == 9123 and ports["http"] != 9123
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9123"
    assert not chart.render().of_kind("ServiceMonitor"), "ServiceMonitor rendered while disabled"


def test_kube_version_floor(chart: Any) -> None:
    """Chart.yaml's kubeVersion is enforced: 1.28 renders, 1.27 is refused by Helm itself."""
    assert chart.template(extra=["--kube-version", "1.28.0"]).returncode == 0
    refused = chart.template(extra=["--kube-version", "1.27.9"])
    assert refused.returncode != 0 and "kubeVersion" in refused.stderr


def test_packaged_chart_holds_what_the_templates_read(chart: Any, tmp_path: Path) -> None:
    proc = chart.run("package", str(chart.path), "--destination", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (archive,) = tmp_path.glob("fleetgate-*.tgz")
    with tarfile.open(archive) as tar:
        members = {name.split("/", 1)[1] for name in tar.getnames()}
    chart_dir = chart.path
    needed = {str(p.relative_to(chart_dir)) for pattern in ("crds/*.yaml", "files/*", "dashboards/*.json",
                                                             "templates/**/*", "values.schema.json", "README.md")
              for p in chart_dir.glob(pattern) if p.is_file()}
    assert needed <= members, f"missing from the package: {sorted(needed - members)}"
    assert not any(m.startswith("ci/") for m in members), "scenario values files belong to the repository only"
