"""The InferencePool published for an InferenceService (the Gateway API Inference Extension's, GA `v1`).

Pure: owner, served model and the Endpoint Picker reference in, a manifest out. The pool selects the engine
pods exactly as the engine Service does (`selector_labels`), on the engine's port, and names FleetGate's
Endpoint Picker Service (`endpointPickerRef`, a Service in the pool's own namespace: the reference has no
namespace) with its `failureMode`. Ownership follows the GIE implementer guide (shared ownership, as for a
Service): no ownerReferences and no labels claiming the object. Annotations only record provenance and the
served model, which the picker's `inferencepool` discovery reads (`fleetgate.io/served-model`), and with
`engine.kvEvents` the engines' event topic (`fleetgate.io/kv-events-topic`: the picker's precise prefix scorer
subscribes to each pod's named `kv-events` port with it); the operator
deletes the pool itself when its InferenceService is gone (`fleetgate.operator.pools`), never through the
garbage collector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fleetgate.engine.kube_names import (
    ANNOTATION_KV_EVENTS_TOPIC,
    ANNOTATION_SERVED_MODEL,
    ANNOTATION_SPEC_HASH,
    ENGINE_PORT,
    POOL_GROUP,
    POOL_KIND,
    POOL_VERSION,
)
from fleetgate.operator.builders.common import Owner, selector_labels, spec_hash

ANNOTATION_PUBLISHED_FOR = "fleetgate.io/published-for"  # "<namespace>/<name>" of the InferenceService
ANNOTATION_PUBLISHED_UID = "fleetgate.io/published-for-uid"  # its uid: a re-created service is another one


@dataclass(frozen=True, kw_only=True)
class EndpointPicker:
    """FleetGate's Endpoint Picker Service, as pools refer to it (in each pool's namespace)."""

    service: str
    port: int = 9002
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


def build_inference_pool(
    *, owner: Owner, served_model: str, picker: EndpointPicker, kv_events_topic: str | None = None
) -> dict[str, Any]:
    spec = {
        "selector": {"matchLabels": selector_labels(owner)},
        "targetPorts": [{"number": ENGINE_PORT}],
        "appProtocol": "http",
        "endpointPickerRef": {"group": "", "kind": "Service", "name": picker.service,
                              "port": {"number": picker.port}, "failureMode": picker.failure_mode},
    }
    annotations = {
        ANNOTATION_SERVED_MODEL: served_model,
        ANNOTATION_PUBLISHED_FOR: f"{owner.namespace}/{owner.name}",
        ANNOTATION_PUBLISHED_UID: owner.uid,
    }
    if kv_events_topic is not None:  # None: the engines publish no KV events
        annotations[ANNOTATION_KV_EVENTS_TOPIC] = kv_events_topic
    annotations[ANNOTATION_SPEC_HASH] = spec_hash({"spec": spec, "annotations": annotations})
    return {
        "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
        "kind": POOL_KIND,
        "metadata": {"name": owner.name, "namespace": owner.namespace, "annotations": annotations},
        "spec": spec,
    }
