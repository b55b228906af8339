"""The engine Service (stable name; its EndpointSlices list the pods the gateway picks from) and the PDB."""

from __future__ import annotations

from typing import Any

from fleetgate.engine.kube_names import ENGINE_PORT, ENGINE_PORT_NAME, KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME
from fleetgate.operator.builders.common import Owner, child, selector_labels
from fleetgate.operator.spec import InferenceServiceSpec


def build_service(*, owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    ports: list[dict[str, Any]] = [
        {"name": ENGINE_PORT_NAME, "port": ENGINE_PORT, "targetPort": ENGINE_PORT_NAME, "protocol": "TCP"}
    ]
    kv = spec.engine.kv_events
    if kv is not None:  # EndpointSlices then carry each pod's KV-event ports to the gateway's discovery
        ports += [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                  for name, port in ((KV_EVENTS_PORT_NAME, kv.port), (KV_REPLAY_PORT_NAME, kv.replay_port))]
    return child(
        api_version="v1",
        kind="Service",
        owner=owner,
        spec={
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": ports,
            # Engines that are still loading are not ready; the gateway must never see them.
            "publishNotReadyAddresses": False,
        },
    )


def build_pdb(*, owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """At most one engine pod voluntarily evicted at a time (a singleton can still be drained)."""
    del spec  # same policy for every size today; kept in the signature for per-spec policies
    return child(
        api_version="policy/v1",
        kind="PodDisruptionBudget",
        owner=owner,
        spec={"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner)}},
    )
