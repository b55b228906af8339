"""Grafana dashboards: one ConfigMap per charts/fleetgate/dashboards/*.json, labelled for the sidecar."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "fleetgate"
DASHBOARD = {"title": "FleetGate test dashboard", "uid": "fg-test", "panels": [{"type": "timeseries", "id": 1}]}


def _by_file(rendered: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for cm in rendered.component("ConfigMap", "dashboards"):
        (filename,) = cm["data"]
        out[filename] = cm
    return out


def test_each_dashboard_file_becomes_a_labelled_configmap(chart_copy: Any) -> None:
    folder = chart_copy.path / "dashboards"
    folder.mkdir(exist_ok=True)
    (folder / "Cost_per tenant.json").write_text(json.dumps(DASHBOARD, indent=2))
    rendered = chart_copy.render()
    configmaps = _by_file(rendered)
    # File names may hold characters that ConfigMap keys and names may not.
    cm = configmaps["cost-per-tenant.json"]
    assert json.loads(cm["data"]["cost-per-tenant.json"]) == DASHBOARD
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["name"].endswith("-dashboard-cost-per-tenant")
    assert cm["metadata"]["namespace"] == "fleet"

    moved = _by_file(chart_copy.render(set_values=["dashboards.namespace=monitoring",
                                                   "dashboards.annotations.grafana_folder=FleetGate"]))
    assert moved["cost-per-tenant.json"]["metadata"]["namespace"] == "monitoring"
    assert moved["cost-per-tenant.json"]["metadata"]["annotations"] == {"grafana_folder": "FleetGate"}
    assert not _by_file(chart_copy.render(set_values=["dashboards.enabled=false"]))


def test_the_shipped_dashboards_are_rendered_verbatim(chart: Any) -> None:
    files = sorted((CHART_DIR / "dashboards").glob("*.json"))
    configmaps = _by_file(chart.render())
    assert len(configmaps) == len(files)
    for f in files:
        key = re.sub(r"[^a-z0-9-]+", "-", f.stem.lower()).strip("-") + ".json"
        assert json.loads(configmaps[key]["data"][key]) == json.loads(f.read_text())
