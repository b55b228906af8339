"""The operator Deployment's command line is accepted by the real `fleetgate operator` parser, agrees with
the rest of the release (namespaces, peering objects, probe port), and its profiles file loads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fleetgate.operator import run_cli
from fleetgate.operator.profiles import load_profiles


def _operator(rendered: Any) -> tuple[dict[str, Any], argparse.Namespace]:
    (deployment,) = rendered.component("Deployment", "operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleetgate", "operator"]
    parser = argparse.ArgumentParser(prog="fleetgate operator", exit_on_error=False)
    run_cli.add_arguments(parser)
    return deployment, parser.parse_args(container["args"])


def test_operator_arguments_parse_and_match_the_release(chart: Any, scenario: Path, tmp_path: Path) -> None:
    rendered = chart.render(values=[scenario])
    if not rendered.component("Deployment", "operator"):
        # Only the gateway-only scenario turns the operator off; then none of its objects may render.
        assert scenario.name == "gateway-only-values.yaml", f"{scenario.name} rendered no operator Deployment"
        assert not rendered.component("ClusterRole", "operator") and not rendered.component("Role", "operator")
        return
    deployment, args = _operator(rendered)
    spec = deployment["spec"]
    assert spec["replicas"] <= 1 and spec["strategy"]["type"] == "Recreate"

    assert not args.standalone, "without peering a second operator would reconcile the same objects"
    # One cluster-wide peering object whatever the scope: `fleetgate operator --priority 100`, run
    # cluster-wide with the default peering name, must meet the chart's operator there to take over. The
    # operator creates it (so the chart must let it); the chart renders none: an object a CLI operator made
    # first would make `helm install` fail (no Helm ownership metadata), and uninstall would delete it.
    assert not rendered.of_kind("KopfPeering") and not rendered.of_kind("ClusterKopfPeering")
    peering_rules = [rule for role in rendered.component("ClusterRole", "operator") for rule in role["rules"]
                     if "clusterkopfpeerings" in rule["resources"]]  # fmt: skip
    assert any({"get", "create", "patch"} <= set(rule["verbs"]) for rule in peering_rules)
    default_cli = argparse.ArgumentParser()
    run_cli.add_arguments(default_cli)
    assert default_cli.parse_args(["--priority", "100"]).peering == args.peering
    roles = {r["metadata"]["namespace"] for r in rendered.component("Role", "operator")}
    if args.all_namespaces:
        assert not roles
    else:
        assert set(args.namespace) == roles
    assert args.liveness_host == "0.0.0.0", "the kubelet probes the pod address"

    (container,) = spec["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[container["livenessProbe"]["httpGet"]["port"]] == args.liveness_port

    profiles_path = None
    if args.profiles is not None:
        mount = next(m for m in container["volumeMounts"] if args.profiles.is_relative_to(m["mountPath"]))
        volume = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        configmap = rendered.get("ConfigMap", volume["configMap"]["name"])
        profiles_path = tmp_path / "profiles.yaml"
        profiles_path.write_text(configmap["data"][str(args.profiles.relative_to(mount["mountPath"]))])
    profiles = load_profiles(path=profiles_path, default=args.default_accelerator)
    assert profiles.default == args.default_accelerator


def test_operator_settings_from_values(chart: Any, tmp_path: Path) -> None:
    rendered = chart.render(
        set_values=["operator.engineImage=registry.local/vllm:v1", "operator.peering.priority=5",
                    "operator.prometheusUrl=http://prom:9090", "operator.livenessPort=9191",
                    "operator.defaultAccelerator=nvidia-h100-80gb"],
    )
    _, args = _operator(rendered)
    assert (args.engine_image, args.priority, args.prometheus_url) == ("registry.local/vllm:v1", 5, "http://prom:9090")
    assert args.liveness_port == 9191 and args.default_accelerator == "nvidia-h100-80gb"
    assert args.profiles is None and not rendered.component("ConfigMap", "operator")


def test_added_accelerator_profile_reaches_the_operator(chart: Any, tmp_path: Path) -> None:
    rendered = chart.render(
        set_json=['operator.acceleratorProfiles={"my-gpu": {"gpu_memory_bytes": 25769803776, '
                  '"node_selector": {"pool": "gpu"}}}'],
        set_values=["operator.defaultAccelerator=my-gpu"],
    )
    _, args = _operator(rendered)
    (configmap,) = rendered.component("ConfigMap", "operator")
    path = tmp_path / "profiles.yaml"
    path.write_text(configmap["data"]["profiles.yaml"])
    profiles = load_profiles(path=path, default=args.default_accelerator)
    profile = profiles.by_name["my-gpu"]
    assert profile.gpu_memory_bytes == 24 * 2**30 and dict(profile.node_selector) == {"pool": "gpu"}

