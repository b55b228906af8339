"""The chart's Endpoint Picker: next to or instead of the gateway, wired to the operator's InferencePools.

Rendered with the real helm binary; the picker's gateway.yaml is loaded with the real settings; the pools the
operator publishes and the example pool are validated against the Gateway API Inference Extension's own CRD
schema (vendored in tests/data/crds); the example HTTPRoute points at a pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetgate.core.config import load_model
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.builders.inferencepool import EndpointPicker, build_inference_pool
from fleetgate.operator.rbac import EPP_RULES, rules_as_yaml

REPO = Path(__file__).resolve().parents[2]
CI = REPO / "charts" / "fleetgate" / "ci"
POOL_CRD = REPO / "tests" / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
EXAMPLES = REPO / "examples" / "gateway-api"


def _triples(rules: Any) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _config(rendered: Any, tmp_path: Path) -> tuple[dict[str, Any], GatewaySettings]:
    (holder,) = [o for o in rendered.objects if o["kind"] in ("ConfigMap", "Secret")
                 and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "epp"]
    text = (holder.get("data") or holder["stringData"])["gateway.yaml"]
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return holder, load_model(GatewaySettings, path)


@pytest.mark.parametrize("values", ["epp-values.yaml", "epp-only-values.yaml"])
def test_picker_is_wired_to_its_config_service_rbac_and_the_operator(chart: Any, tmp_path: Path, values: str) -> None:
    rendered = chart.render(values=[CI / values])
    (deployment,) = rendered.component("Deployment", "epp")
    (service,) = rendered.component("Service", "epp")
    holder, settings = _config(rendered, tmp_path)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleetgate", "epp"] and "--config=/etc/fleetgate/gateway.yaml" in container["args"]
    grpc = next(p for p in container["ports"] if p["name"] == "grpc")["containerPort"]
    assert settings.epp.host == "0.0.0.0" and settings.epp.port == grpc == service["spec"]["ports"][0]["port"]
    assert service["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    assert {container["readinessProbe"]["grpc"]["service"], container["livenessProbe"]["grpc"]["service"]} == {
        "readiness", "liveness"}  # the protocol's health services
    assert settings.discovery.kind == "inferencepool"
    (role,) = rendered.component("Role", "epp")
    assert role["metadata"]["namespace"] == settings.discovery.namespace
    assert _triples(role["rules"]) == _triples(EPP_RULES)  # read pools and pods, nothing else
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    config = volumes["config"]
    assert (config.get("configMap", {}).get("name") or config["secret"]["secretName"]) == holder["metadata"]["name"]
    operator = rendered.component("Deployment", "operator")
    if operator:
        args = operator[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--epp-service={service['metadata']['name']}" in args and f"--epp-port={grpc}" in args
    gateway = rendered.component("Deployment", "gateway")
    assert bool(gateway) is (values == "epp-values.yaml")  # next to, or instead of, the gateway
    if gateway:  # two doors, one pipeline: the same tenants, keys and shared state
        gw_holder = next(o for o in rendered.objects if o["kind"] in ("ConfigMap", "Secret")
                         and o["metadata"]["name"] == gateway[0]["metadata"]["name"])
        gw_text = (gw_holder.get("data") or gw_holder["stringData"])["gateway.yaml"]
        (tmp_path / "gw.yaml").write_text(gw_text)
        gw_settings = load_model(GatewaySettings, tmp_path / "gw.yaml")
        assert gw_settings.redis_url == settings.redis_url and gw_settings.tenancy == settings.tenancy
        assert "keys" in volumes
        policy = rendered.get("NetworkPolicy", next(o["metadata"]["name"] for o in rendered.of_kind("NetworkPolicy")))
        allowed = [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in policy["spec"]["ingress"][0][
            "from"]]
        assert allowed == ["gateway", "epp"]  # the picker reaches the bundled Redis


def test_epp_rule_file_is_generated_from_operator_rbac() -> None:
    text = (REPO / "charts" / "fleetgate" / "files" / "epp-rbac.yaml").read_text()
    assert "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#")) == rules_as_yaml(
        epp=True), "charts/fleetgate/files/epp-rbac.yaml is stale: regenerate it from rules_as_yaml(epp=True)"


def test_picker_is_off_by_default(chart: Any) -> None:
    rendered = chart.render()
    assert not rendered.component("Deployment", "epp")
    args = rendered.component("Deployment", "operator")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--epp")]


@pytest.mark.parametrize(("values", "message"), [
    (["epp.enabled=true", "epp.replicas=2", "redis.enabled=false"], "no Redis is configured"),
    (["epp.enabled=true", "operator.enabled=false"], "needs the operator"),
    (["epp.enabled=true", "gateway.discovery.namespace=elsewhere"], "cannot name a Service in another namespace"),
])  # fmt: skip
def test_impossible_picker_setups_fail_with_a_reason(chart: Any, values: list[str], message: str) -> None:
    assert message in chart.fail(set_values=values)


def _pool_schema() -> dict[str, Any]:
    crd = yaml.safe_load(POOL_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_published_and_example_pools_satisfy_the_inference_extension_crd() -> None:
    validator = jsonschema.Draft7Validator(_pool_schema())
    built = build_inference_pool(owner=Owner(name="qwen", namespace="ml", uid="u-1"), served_model="qwen",
                                 picker=EndpointPicker(service="fleetgate-epp", port=9002, failure_mode="FailOpen"))
    (example,) = [d for d in yaml.safe_load_all((EXAMPLES / "inferencepool.yaml").read_text()) if d]
    for pool in (built, example):
        errors = sorted(e.message for e in validator.iter_errors(pool))
        assert not errors, errors
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert {k: v for k, v in built["spec"].items() if k != "endpointPickerRef"} == \
        {k: v for k, v in example["spec"].items() if k != "endpointPickerRef"}  # the example is what is published
    bad = {**built, "spec": {**built["spec"], "targetPorts": [{"number": 70000}]}}
    assert list(validator.iter_errors(bad)), "the schema is really applied"


def test_example_route_sends_inference_paths_to_a_pool() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all((EXAMPLES / "httproute.yaml").read_text()) if d}
    route, gateway = docs["HTTPRoute"], docs["Gateway"]
    assert route["apiVersion"] == gateway["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen"}
    for doc in docs.values():
        assert "namespace" not in doc["metadata"]  # `kubectl apply -n <namespace>`
