"""Bad values fail early with a message that names the problem: values.schema.json for wrong keys,
types and ranges, the chart's `fail` checks for combinations that cannot work together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "fleetgate"
A_HASH = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["gateway.replicaz=3"], "additional properties 'replicaz' not allowed"),
        (["gateway.replicas=0"], "/gateway/replicas"),
        (["gateway.service.type=Ingress"], "/gateway/service/type"),
        (["redis.externalUrl=http://redis:6379"], "/redis/externalUrl"),
        (["operator.replicas=2"], "/operator/replicas"),
        (["gateway.autoscaling.targetCPUUtilizationPercentage=150"], "/gateway/autoscaling/targetCPU"),
        (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["gateway.config.unknownSection.x=1"], "additional properties 'unknownSection' not allowed"),
        (["gateway.apiKeys.adminKeyHashes={fg-a-key-in-clear}"], "/gateway/apiKeys/adminKeyHashes/0"),
        (["serviceMonitor.interval=often"], "/serviceMonitor/interval"),
        (["fullnameOverride=Not_A_DNS_Name"], "/fullnameOverride"),
    ],
)
def test_schema_rejects_bad_values(chart: Any, args: list[str], expected: str) -> None:
    message = chart.fail(set_values=args)
    assert "values don't meet the specifications of the schema" in message
    assert expected in message


def test_schema_accepts_the_defaults_and_is_strict_everywhere() -> None:
    """Every object level the chart defines forbids unknown keys (config sections are checked by the
    gateway's own loader in test_chart_config.py)."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    free_form = {"affinity", "routing", "cache", "tiers", "tenancy", "server", "items"}

    def walk(node: dict[str, Any], where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} allows unknown keys"
        for key, child in node.get("properties", {}).items():
            if key not in free_form:
                walk(child, f"{where}.{key}")
        for key, child in node.get("definitions", {}).items():
            walk(child, f"#/definitions/{key}")

    walk(schema, "values")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]), "values.yaml and the schema disagree on top-level keys"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["redis.externalUrl=redis://cache:6379/0"], "redis.enabled=true and redis.externalUrl are both set"),
        (["redis.enabled=false", "gateway.replicas=3"], "the gateway can run 3 replicas but no Redis is configured"),
        (
            ["redis.enabled=false", "gateway.replicas=1", "gateway.autoscaling.enabled=true"],
            "the gateway can run 10 replicas but no Redis is configured",
        ),
        (
            ["gateway.autoscaling.enabled=true", "gateway.autoscaling.minReplicas=5",
             "gateway.autoscaling.maxReplicas=2"],
            "gateway.autoscaling.minReplicas (5) is greater than gateway.autoscaling.maxReplicas (2)",
        ),
        (
            ["operator.watchAllNamespaces=true", "operator.watchNamespaces={a,b}"],
            "operator.watchAllNamespaces=true and operator.watchNamespaces are both set",
        ),
        (
            ["gateway.apiKeys.existingSecret=keys", f"gateway.apiKeys.adminKeyHashes={{{A_HASH}}}"],
            "gateway.apiKeys.existingSecret is set together with",
        ),
        (["gateway.config.server.port=9000"], "gateway.config.server.port is set by the chart: use gateway.port"),
        (["gateway.config.server.log_level=debug"], "use gateway.logLevel instead"),
        (["gateway.config.server.drain_s=10"], "use gateway.drainSeconds instead"),
        (["gateway.drainSeconds=48"], "gateway.terminationGracePeriodSeconds (60) is shorter than a gateway pod's"),
        (["gateway.config.server.drain_close_s=20"], "+ gateway.config.server.drain_close_s (20) + gateway.config"),
        # the settle writes' own deadline counts too: 5 + 40 + 3 + (14 + 1) = 63 > 60
        (["gateway.config.server.settle_s=14"], "+ gateway.config.server.settle_s + 1 s to exit (15 s) = 63 s"),
        (
            [f"gateway.apiKeys.tenants.ghost={{{A_HASH}}}"],
            'keys for tenant "ghost", which is not in gateway.config.tenancy.tenants',
        ),
    ],
)
def test_invalid_combinations_fail_with_a_readable_message(chart: Any, args: list[str], expected: str) -> None:
    message = chart.fail(set_values=args)
    assert expected in message, message


def test_combinations_that_look_close_but_are_valid(chart: Any) -> None:
    """The checks above are not over-eager: each neighbouring valid combination renders."""
    chart.render(set_values=["redis.enabled=false", "redis.externalUrl=redis://cache:6379/0", "gateway.replicas=4"])
    chart.render(set_values=["redis.enabled=false", "gateway.replicas=1"])
    chart.render(set_values=["gateway.autoscaling.enabled=true", "gateway.autoscaling.minReplicas=3",
                             "gateway.autoscaling.maxReplicas=3"])
    chart.render(set_values=["gateway.apiKeys.existingSecret=keys"])
    chart.render(set_values=["gateway.drainSeconds=47"])  # preStop 5 + 47 + drain_close_s 3 + 4 + 1 = 60: fits
    chart.render(set_values=["gateway.config.server.settle_s=11"])  # 5 + 40 + 3 + 11 + 1 = 60: just fits
    chart.render(set_values=["gateway.drainSeconds=300", "gateway.terminationGracePeriodSeconds=320"])
    chart.render(
        set_json=['gateway.config.tenancy={"tenants": [{"id": "ghost"}]}'],
        set_values=[f"gateway.apiKeys.tenants.ghost={{{A_HASH}}}"],
    )


def test_every_key_in_values_yaml_has_a_comment() -> None:
    """Each key has a comment line right above it; keys inside a value that is itself Kubernetes data
    (resources, dashboards.labels) are covered by the comment on that value."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    missing = []
    data_indent: int | None = None
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(stripped)
        if data_indent is not None and indent > data_indent:
            continue
        data_indent = indent if stripped in {"resources:", "labels:"} else None
        above = lines[i - 1] if i else ""
        if not (above.lstrip().startswith("#") and len(above) - len(above.lstrip()) == indent):
            missing.append(f"line {i + 1}: {stripped}")
    assert not missing, "keys without a comment right above them:\n" + "\n".join(missing)
