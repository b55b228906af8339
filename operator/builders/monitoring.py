"""A Prometheus Operator ServiceMonitor for the engines' `/metrics` (only when its CRD exists)."""

from __future__ import annotations

from typing import Any

from fleetgate.engine.kube_names import ENGINE_PORT_NAME
from fleetgate.operator.builders.common import Owner, child, selector_labels


def build_service_monitor(*, owner: Owner) -> dict[str, Any]:
    return child(
        api_version="monitoring.coreos.com/v1",
        kind="ServiceMonitor",
        owner=owner,
        spec={
            "selector": {"matchLabels": selector_labels(owner)},
            "endpoints": [{"port": ENGINE_PORT_NAME, "path": "/metrics", "interval": "15s"}],
        },
    )
